"""Symbolic equivalence checks in a persistent, killable worker process.

Why a process and not a signal alarm: sympy can spend minutes inside one C-level big-integer
operation (``10**(10**10)``), where a SIGALRM handler never gets to run. A separate process can
always be killed. The worker is started lazily, kept alive between calls (importing sympy costs
about a second), killed on timeout, and started again on the next call. It never outlives its
parent: Linux's parent-death signal kills it even in the middle of a computation (see
``die_with_parent``), and EOF on its request pipe ends it between requests.

Calls are serialised by a lock, so several threads may share the worker. The parent never imports
sympy. The worker only receives strings that passed ``latex_to_sympy`` validation, because
``parse_expr`` evaluates its input.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

STARTUP_TIMEOUT_S = 120.0
"""Worker start (interpreter + sympy import) is not charged to the per-call timeout."""
WORKER_MEMORY_HEADROOM = 2 << 30
"""The worker may grow this much over its size at start; a runaway big-int then fails fast."""
REL_TOL = 1e-6
PR_SET_PDEATHSIG = 1

EQUAL = "equal"
NOT_EQUAL = "not_equal"
PARSE_ERROR = "parse_error"
TIMEOUT = "timeout"
TOO_COMPLEX = "too_complex"
WORKER_ERROR = "worker_error"


# ------------------------------------------------------------------ code running in the worker


def _limit_memory() -> None:
    try:
        import resource

        with open("/proc/self/status", encoding="ascii") as f:
            vm_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
        limit = vm_kb * 1024 + WORKER_MEMORY_HEADROOM
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (OSError, ValueError, StopIteration, ImportError):
        pass  # best effort: the timeout still bounds the damage


def _parse(src: str) -> Any:
    import sympy
    from sympy.parsing.sympy_parser import (
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    local_dict: dict[str, Any] = {}
    for name in set(_identifiers(src)):
        if name in ("sqrt", "sin", "cos", "tan", "sec", "csc", "cot", "asin", "acos", "atan",
                    "sinh", "cosh", "tanh", "log", "exp", "pi", "oo", "binomial", "factorial", "Matrix"):
            continue
        # Every other name is a plain symbol, so single letters such as N, S, O, Q (sympy
        # functions) cannot change meaning. e and i are read as the constants; both sides of a
        # comparison get the same reading, so this never makes two different answers equal.
        local_dict[name] = {"e": sympy.E, "i": sympy.I}.get(name) or sympy.Symbol(name)
    transformations = standard_transformations + (implicit_multiplication_application,)
    expr = parse_expr(src, local_dict=local_dict, transformations=transformations, evaluate=True)
    if isinstance(expr, sympy.MatrixBase):
        return sympy.ImmutableMatrix(expr)
    if not isinstance(expr, sympy.Expr):
        raise TypeError(f"not an expression: {type(expr).__name__}")
    return expr


def _identifiers(src: str) -> list[str]:
    import re

    return re.findall(r"[A-Za-z_][A-Za-z0-9_]*", src)


def _numerically_close(a: Any, b: Any) -> bool:
    import sympy

    va = complex(sympy.N(a, 30))
    vb = complex(sympy.N(b, 30))
    scale = max(abs(va), abs(vb))
    return abs(va - vb) < REL_TOL * scale if scale else True


def compare_expressions(a_src: str, b_src: str) -> str:
    """EQUAL / NOT_EQUAL for two validated expression strings (runs inside the worker)."""
    import sympy

    a = _parse(a_src)
    b = _parse(b_src)
    a_matrix, b_matrix = isinstance(a, sympy.MatrixBase), isinstance(b, sympy.MatrixBase)
    if a_matrix or b_matrix:  # entry by entry, with the scalar rules
        if not (a_matrix and b_matrix) or a.shape != b.shape:
            return NOT_EQUAL
        pairs = zip(a, b)
        return EQUAL if all(_scalars_equal(x, y) for x, y in pairs) else NOT_EQUAL
    return EQUAL if _scalars_equal(a, b) else NOT_EQUAL


def _scalars_equal(a: Any, b: Any) -> bool:
    import sympy

    diff = a - b
    if diff == 0:
        return True
    has_float = a.has(sympy.Float) or b.has(sympy.Float)
    if has_float and not diff.free_symbols:
        # a decimal answer vs an exact one (sqrt(2)/2 vs 0.7071068): same tolerance as the fast path
        return _numerically_close(a, b)
    return bool(sympy.simplify(diff) == 0)


def die_with_parent(parent_pid: int) -> None:
    """Asks Linux to SIGKILL this process when its parent dies; exits now if the parent is gone already.

    EOF on the request pipe only ends the worker between requests; a worker busy inside sympy would
    otherwise run on (and burn CPU) after its parent was killed. The ``getppid`` check closes the
    race of a parent that died before the ``prctl`` call. Elsewhere than Linux only that check runs.
    """
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:
        os._exit(0)


def serve(read_fd: int, write_fd: int, parent_pid: int | None = None) -> None:
    """Worker main loop: (a, b) requests in, verdict strings out, until EOF or None."""
    import signal

    if parent_pid is not None:
        die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    requests = Connection(read_fd, writable=False)
    replies = Connection(write_fd, readable=False)
    _limit_memory()
    try:
        import sympy  # noqa: F401  (the expensive import, done before reporting ready)
    except Exception as exc:  # pragma: no cover - depends on the environment
        replies.send(("error", repr(exc)))
        return
    replies.send(("ready", None))
    while True:
        try:
            msg = requests.recv()
        except (EOFError, OSError):
            return  # parent went away
        if msg is None:
            return
        try:
            verdict = compare_expressions(*msg)
        except MemoryError:
            verdict = TOO_COMPLEX  # a runaway computation hit the memory cap
        except Exception:
            verdict = PARSE_ERROR
        try:
            replies.send(verdict)
        except (EOFError, OSError):
            return


# ------------------------------------------------------------------ parent side

# The worker loads this file by path rather than importing the package, so that whatever
# ``slime_ext/__init__.py`` imports (possibly torch) is never loaded into the worker.
_THIS_FILE = str(Path(__file__).resolve())
_BOOTSTRAP = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('_slime_sympy_worker', sys.argv[3])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "module.serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[4]))\n"
)
# Linux sends the parent-death signal when the *thread* that forked the worker exits, so workers are
# forked from one long-lived thread rather than from whichever short-lived thread first needed one.
_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sympy-worker-spawner")


class SympyWorker:
    """Thread-safe handle on one lazily started, restartable sympy process.

    The worker is a fresh interpreter started with ``subprocess`` rather than
    ``multiprocessing.get_context("spawn")``: spawn re-imports the caller's ``__main__`` in the
    child, which re-runs any entry-point script that lacks an ``if __name__ == "__main__":``
    guard (a training script would start training again inside the verifier). A plain
    interpreter running one import avoids that; the messages still use
    ``multiprocessing.connection.Connection`` framing over two private pipes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._requests: Connection | None = None
        self._replies: Connection | None = None
        self.starts = 0  # how many workers were started; tests and logs read it

    def compare(self, a_src: str, b_src: str, timeout_s: float) -> str:
        """EQUAL, NOT_EQUAL, PARSE_ERROR, TIMEOUT, TOO_COMPLEX or WORKER_ERROR; never raises or hangs."""
        with self._lock:
            try:
                if not self._ensure_started():
                    return WORKER_ERROR
                assert self._requests is not None and self._replies is not None
                self._requests.send((a_src, b_src))
                if not self._replies.poll(max(timeout_s, 0.0)):
                    self._kill()
                    return TIMEOUT
                verdict = self._replies.recv()
            except (EOFError, OSError):
                self._kill()
                return WORKER_ERROR
            if verdict == TOO_COMPLEX:  # MemoryError in the worker: start clean next time
                self._kill()
            return verdict if isinstance(verdict, str) else WORKER_ERROR

    @property
    def pid(self) -> int | None:
        with self._lock:
            return self._proc.pid if self._proc is not None else None

    def _ensure_started(self) -> bool:
        if self._proc is not None and self._proc.poll() is None:
            return True
        self._kill()
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        try:
            self._proc = _spawner.submit(
                subprocess.Popen,
                [sys.executable, "-c", _BOOTSTRAP, str(req_r), str(rep_w), _THIS_FILE, str(os.getpid())],
                pass_fds=(req_r, rep_w),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                close_fds=True,
            ).result()
        except (OSError, RuntimeError):
            for fd in (req_r, req_w, rep_r, rep_w):
                os.close(fd)
            return False
        os.close(req_r)
        os.close(rep_w)
        self._requests = Connection(req_w, readable=False)
        self._replies = Connection(rep_r, writable=False)
        self.starts += 1
        if self._replies.poll(STARTUP_TIMEOUT_S):
            status, _ = self._replies.recv()
            if status == "ready":
                return True
        self._kill()
        return False

    def _kill(self) -> None:
        """Kills and reaps the worker, so no zombie is left behind. Caller holds the lock."""
        proc = self._proc
        for conn in (self._requests, self._replies):
            if conn is not None:
                conn.close()
        self._proc, self._requests, self._replies = None, None, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL not delivered
                pass

    def shutdown(self) -> None:
        """Asks the worker to exit, kills it if it does not; safe to call repeatedly."""
        with self._lock:
            if self._proc is not None and self._requests is not None and self._proc.poll() is None:
                try:
                    self._requests.send(None)
                    self._proc.wait(timeout=2)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._kill()

    def _forget_after_fork(self) -> None:
        # In a forked child the worker belongs to the parent: drop the handles, never kill it.
        # The spawner's thread did not survive the fork either, so the child gets a new one.
        global _spawner
        _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sympy-worker-spawner")
        self._lock = threading.Lock()
        for conn in (self._requests, self._replies):
            if conn is not None:
                try:
                    conn.close()
                except OSError:
                    pass
        self._proc, self._requests, self._replies = None, None, None


_WORKER = SympyWorker()
atexit.register(_WORKER.shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WORKER._forget_after_fork)


def get_worker() -> SympyWorker:
    """The process-wide shared worker."""
    return _WORKER
