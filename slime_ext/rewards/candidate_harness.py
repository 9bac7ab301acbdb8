"""The program that runs *inside* the code sandbox, around the untrusted candidate.

It is executed as source (``python -I -S -c``), never imported by the verifier, and uses only the
standard library because the sandbox shows nothing else. It knows the candidate program, the tests'
setup statements and the *call side* of each check (the sub-expressions that need the candidate's
names); it never sees an expected value, so neither the candidate's frames nor its memory hold one.

Each evaluated sub-expression is written to the results fd as plain data: the exact built-in types
None, bool, int, float, complex, str, bytes, list, tuple, dict, set and frozenset, checked with
``type(x) is``, so a subclass or an object with a custom ``__eq__`` is refused rather than sent.
The verifier decides the verdict from those values; what this process says about pass/fail does not
exist.

Plan (JSON on stdin): {"solution": str, "steps": [{"exec": src} | {"id": n, "eval": [src, ...]}],
"uid": int | null, "nproc": int, "block_network": bool}.
"""

import json
import os
import sys
import traceback

MAX_DEPTH = 64
MAX_ITEMS = 100_000


class NotPlainData(TypeError):
    pass


def _encode(x, depth=0, budget=None):
    budget = budget if budget is not None else [MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise NotPlainData("value too large or too deeply nested")
    t = type(x)
    if x is None or t is bool or t is int or t is str:
        return x
    if t is float:
        return {"float": repr(x)}
    if t is complex:
        return {"complex": [repr(x.real), repr(x.imag)]}
    if t is bytes:
        return {"bytes": x.hex()}
    if t in (list, tuple, set, frozenset):
        return {t.__name__: [_encode(v, depth + 1, budget) for v in x]}
    if t is dict:
        return {"dict": [[_encode(k, depth + 1, budget), _encode(v, depth + 1, budget)] for k, v in x.items()]}
    raise NotPlainData("a %s object is not plain data" % t.__name__)


def _drop_privileges(uid, nproc):
    import resource

    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _block_network():
    import socket

    def _refuse(*args, **kwargs):
        raise OSError("network disabled")

    class _NoNetworkSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            raise OSError("network disabled")

    socket.socket = _NoNetworkSocket
    socket.create_connection = _refuse
    socket.getaddrinfo = _refuse


def _main():
    results_fd = int(sys.argv[1])
    plan = json.loads(sys.stdin.read())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    sys.stdin = open(os.devnull)

    def emit(record):
        try:
            line = json.dumps(record)
        except (ValueError, TypeError) as exc:  # e.g. an int too long to print
            line = json.dumps({"id": record.get("id"), "error": "NotPlainData: " + str(exc)[:200]})
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        os.write(results_fd, (line + "\n").encode("utf-8", "replace"))

    def fail(phase, exc):
        traceback.print_exc()
        emit({"phase": phase, "error": "%s: %s: %s" % (phase, type(exc).__name__, str(exc)[:1000])})
        os._exit(0)  # do not wait for threads or atexit hooks the program left behind

    if plan.get("uid") is not None:
        _drop_privileges(plan["uid"], plan["nproc"])
    if plan.get("block_network"):
        _block_network()
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(plan["solution"], "solution.py", "exec"), namespace)
    except BaseException as exc:
        fail("solution", exc)
    for step in plan["steps"]:
        if "exec" in step:
            try:
                exec(compile(step["exec"], "tests.py", "exec"), namespace)
            except BaseException as exc:
                fail("tests", exc)
            continue
        values = []
        try:
            for src in step["eval"]:
                values.append(_encode(eval(compile(src, "tests.py", "eval"), namespace)))
        except NotPlainData as exc:
            emit({"id": step["id"], "error": "NotPlainData: " + str(exc)})
            continue
        except BaseException as exc:
            traceback.print_exc()
            emit({"id": step["id"], "error": "%s: %s" % (type(exc).__name__, str(exc)[:1000])})
            continue
        emit({"id": step["id"], "values": values})
    emit({"done": True})
    os._exit(0)


if __name__ == "__main__":
    _main()
