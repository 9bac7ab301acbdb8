"""Run an untrusted Python program plus its assert-based tests in a throw-away, limited process.

Layers, each covering what the previous one misses:
* a fresh ``python -I`` interpreter (no user site, no PYTHON* variables), a fresh temp dir as cwd,
  an environment reduced to a minimal PATH;
* rlimits set in ``preexec_fn``: address space (memory), CPU seconds, file size, no core dumps;
  RLIMIT_NPROC is not used because it is per-user and does not apply to root;
* a wall-clock deadline, enforced by killing the whole process group (``start_new_session``);
* no network: the harness replaces ``socket.socket``, ``socket.create_connection`` and
  ``socket.getaddrinfo`` before the program runs and, where ``unshare --net`` works on this
  machine (probed once), the process also runs in an empty network namespace.

The verdict comes from a harness that runs the program and then the tests in one namespace and
reports over a private pipe, tagged with a nonce passed on stdin. A program that calls
``sys.exit(0)``/``os._exit(0)`` before the tests therefore does not pass. This is a guard against
accidents and simple reward hacks, not a security boundary against code that introspects the
harness's frames, and a child that calls ``setsid`` escapes the process-group kill.
"""

from __future__ import annotations

import functools
import json
import math
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

OUTPUT_TAIL_BYTES = 4096
MAX_FILE_BYTES = 4 << 20
STARTUP_GRACE_S = 1.0
"""Added to the wall-clock limit for interpreter start, which is slow on a loaded machine."""

_HARNESS = r'''
import json, os, sys, traceback


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


def _failed_line(exc, filename, source):
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename == filename and frame.lineno:
            lines = source.splitlines()
            if 0 < frame.lineno <= len(lines):
                return lines[frame.lineno - 1].strip()
    return ""


def _main():
    status_fd, solution_path, tests_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    nonce = sys.stdin.readline().strip()
    sys.stdin.close()
    sys.stdin = open(os.devnull)

    def report(status, message=""):
        payload = json.dumps({"nonce": nonce, "status": status, "message": str(message)[:2000]})
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        os.write(status_fd, payload.encode("utf-8", "replace"))
        os._exit(0)  # do not wait for threads or atexit hooks the program left behind

    _block_network()
    with open(solution_path, encoding="utf-8") as f:
        solution = f.read()
    with open(tests_path, encoding="utf-8") as f:
        tests = f.read()
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    phase = "solution"
    try:
        exec(compile(solution, "solution.py", "exec"), namespace)
        phase = "tests"
        exec(compile(tests, "tests.py", "exec"), namespace)
    except MemoryError:
        report("memory_limit", phase + ": MemoryError")
    except AssertionError as exc:
        if phase == "tests":
            line = _failed_line(exc, "tests.py", tests)
            report("tests_failed", line + (": " + str(exc) if str(exc) else ""))
        else:
            report("runtime_error", "solution: AssertionError: " + str(exc))
    except BaseException as exc:
        traceback.print_exc()
        report("runtime_error", phase + ": " + type(exc).__name__ + ": " + str(exc))
    report("ok")


_main()
'''


@dataclass(frozen=True)
class SandboxOutcome:
    """status: "ok", "tests_failed", "runtime_error", "memory_limit" or "time_limit"."""

    status: str
    message: str
    stdout: str
    stderr: str
    returncode: int | None


@functools.lru_cache(maxsize=1)
def unshare_prefix() -> tuple[str, ...]:
    """``("/usr/bin/unshare", "--net")`` if an empty network namespace can be made here, else ()."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    try:
        probe = subprocess.run(
            [exe, "--net", sys.executable, "-I", "-c", "pass"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return ()
    return (exe, "--net") if probe.returncode == 0 else ()


def _limits_preexec(time_limit_s: float, memory_limit_mb: int) -> Callable[[], None]:
    """preexec_fn setting the rlimits. Values are computed here so the child only calls setrlimit."""
    cpu = math.ceil(time_limit_s) + 1
    wanted = [
        (resource.RLIMIT_AS, (memory_limit_mb << 20,) * 2),
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),  # soft: SIGXCPU, hard: SIGKILL
        (resource.RLIMIT_FSIZE, (MAX_FILE_BYTES,) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    limits = []
    for res, (soft, hard) in wanted:
        _, current_hard = resource.getrlimit(res)
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        limits.append((res, (soft, hard)))
    setrlimit = resource.setrlimit

    def preexec() -> None:
        for res, pair in limits:
            setrlimit(res, pair)

    return preexec


def _minimal_env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _tail(path: Path, limit: int = OUTPUT_TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - limit))
            data = f.read(limit)
    except OSError:
        return ""
    prefix = "...[truncated]\n" if size > limit else ""
    return prefix + data.decode("utf-8", "replace")


def _read_status(fd: int, nonce: str) -> dict[str, str] | None:
    """The harness's report, or None if absent, malformed or not carrying our nonce."""
    os.set_blocking(fd, False)  # an escaped grandchild may still hold the write end open
    chunks = []
    try:
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            if sum(map(len, chunks)) > 65536:
                break
    except BlockingIOError:
        pass
    try:
        status = json.loads(b"".join(chunks).decode("utf-8", "replace"))
    except ValueError:
        return None
    if not isinstance(status, dict) or status.get("nonce") != nonce:
        return None
    return status


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _looks_like_oom(stderr: str) -> bool:
    return any(s in stderr for s in ("MemoryError", "Cannot allocate memory", "bad_alloc", "out of memory"))


def run_sandboxed(program: str, tests: str, time_limit_s: float = 5.0, memory_limit_mb: int = 512) -> SandboxOutcome:
    """Runs ``program`` then ``tests`` in a limited subprocess and classifies what happened."""
    with tempfile.TemporaryDirectory(prefix="slime_code_", ignore_cleanup_errors=True) as tmp_name:
        tmp = Path(tmp_name)
        workdir = tmp / "work"
        workdir.mkdir()
        harness, solution, test_file = tmp / "harness.py", tmp / "solution.py", tmp / "tests.py"
        harness.write_text(_HARNESS, encoding="utf-8")
        solution.write_text(program, encoding="utf-8", errors="replace")
        test_file.write_text(tests, encoding="utf-8", errors="replace")
        stdout_path, stderr_path = tmp / "stdout.txt", tmp / "stderr.txt"
        nonce = secrets.token_hex(16)
        status_r, status_w = os.pipe()
        cmd = [*unshare_prefix(), sys.executable, "-I", str(harness), str(status_w), str(solution), str(test_file)]
        try:
            with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=err,
                    cwd=workdir,
                    env=_minimal_env(str(workdir)),
                    pass_fds=(status_w,),
                    start_new_session=True,
                    preexec_fn=_limits_preexec(time_limit_s, memory_limit_mb),
                )
        finally:
            os.close(status_w)
        timed_out = False
        try:
            try:
                assert proc.stdin is not None
                proc.stdin.write(nonce.encode() + b"\n")
                proc.stdin.close()
            except OSError:
                pass  # the child already died; the classification below says why
            try:
                proc.wait(timeout=time_limit_s + STARTUP_GRACE_S)
            except subprocess.TimeoutExpired:
                timed_out = True
        finally:
            _kill_group(proc.pid)  # the program's own children too
            proc.wait()
            status = _read_status(status_r, nonce)
            os.close(status_r)
        stdout, stderr = _tail(stdout_path), _tail(stderr_path)
    rc = proc.returncode
    if status is not None:
        return SandboxOutcome(str(status.get("status")), str(status.get("message", "")), stdout, stderr, rc)
    if timed_out:
        return SandboxOutcome("time_limit", f"wall-clock limit of {time_limit_s:g}s exceeded", stdout, stderr, rc)
    if rc in (-signal.SIGXCPU, -signal.SIGKILL):
        return SandboxOutcome("time_limit", f"CPU limit exceeded (signal {-rc})", stdout, stderr, rc)
    if _looks_like_oom(stderr):
        return SandboxOutcome("memory_limit", "out of memory", stdout, stderr, rc)
    return SandboxOutcome("runtime_error", f"exited with code {rc} before the tests completed", stdout, stderr, rc)
