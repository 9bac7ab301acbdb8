"""Symbolic equivalence checks in a persistent, killable worker process.

Why a process and not a signal alarm: sympy can spend minutes inside one C-level big-integer
operation (``10**(10**10)``), where a SIGALRM handler never gets to run. A separate process can
always be killed. The worker is started lazily, kept alive between calls (importing sympy costs
about a second), killed on timeout, and replaced at once in the background, so the next call waits
for the new worker only within its own time limit. It never outlives its
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
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

STARTUP_TIMEOUT_S = 120.0
"""The longest a worker may take to start (interpreter + sympy import). Only the first start of a
worker handle is waited for this long; later starts run in the background (see ``SympyWorker``)."""
WARM_UP = ("(x+1)**2", "x**2+2*x+1")
"""Compared once before a worker reports ready: sympy imports much of ``simplify`` on first use, and a
freshly restarted worker should not spend a caller's limit on that."""
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
WORKER_BUSY = "worker_busy"
"""The caller's time ran out waiting for the worker: restarting after a kill, or serving another thread."""


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

        compare_expressions(*WARM_UP)
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


class _Process:
    """One running, ready worker and the two ends of its pipes.

    A plain class, not a dataclass: the worker loads this file without registering it in
    ``sys.modules``, where ``dataclasses`` would look for the module.
    """

    def __init__(self, proc: subprocess.Popen[bytes], requests: Connection, replies: Connection) -> None:
        self.proc, self.requests, self.replies = proc, requests, replies

    def kill(self) -> None:
        """SIGKILL (ends even a worker inside one big-integer operation) and closes the pipes; no reaping."""
        for conn in (self.requests, self.replies):
            conn.close()
        if self.proc.poll() is None:
            self.proc.kill()

    def close(self) -> None:
        """Kills and reaps the worker, so no zombie is left behind."""
        self.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL not delivered
            pass

    def kill_and_reap_in_background(self) -> None:
        """Kills now and leaves the reaping to the spawner thread, ahead of the successor's start.

        Tearing down a worker that grew large takes a moment; the caller whose request timed out
        should not spend it.
        """
        self.kill()
        try:
            _spawner.submit(self.proc.wait, 10)
        except RuntimeError:  # the interpreter is shutting down: no new threads; reap here
            self.close()

    def ask_to_exit(self) -> None:
        """Asks an idle worker to exit, then makes sure it is gone."""
        try:
            if self.proc.poll() is None:
                self.requests.send(None)
                self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.close()


def _launch() -> _Process | None:
    """Starts a worker and waits until it has imported sympy; runs on the spawner thread.

    None when the interpreter cannot be started or does not report ready within ``STARTUP_TIMEOUT_S``.
    """
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, str(req_r), str(rep_w), _THIS_FILE, str(os.getpid())],
            pass_fds=(req_r, rep_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            close_fds=True,
        )
    except OSError:
        for fd in (req_r, req_w, rep_r, rep_w):
            os.close(fd)
        return None
    os.close(req_r)
    os.close(rep_w)
    process = _Process(proc, Connection(req_w, readable=False), Connection(rep_r, writable=False))
    try:
        if process.replies.poll(STARTUP_TIMEOUT_S) and process.replies.recv()[0] == "ready":
            return process
    except (EOFError, OSError):
        pass
    process.close()
    return None


class SympyWorker:
    """Thread-safe handle on one lazily started, restartable sympy process.

    The worker is a fresh interpreter started with ``subprocess`` rather than
    ``multiprocessing.get_context("spawn")``: spawn re-imports the caller's ``__main__`` in the
    child, which re-runs any entry-point script that lacks an ``if __name__ == "__main__":``
    guard (a training script would start training again inside the verifier). A plain
    interpreter running one import avoids that; the messages still use
    ``multiprocessing.connection.Connection`` framing over two private pipes.

    Time limits cover the whole call. A worker killed after a timeout is replaced in the background
    at once, so the restart (interpreter + sympy import, about a second) is not charged to whichever
    call comes next: that call waits for the new worker, and for the lock another thread holds, only
    within its own limit, and reports ``WORKER_BUSY`` when the limit runs out first. Only the very
    first start of a worker is waited for uncharged (``wait_for_first_start``, up to
    ``STARTUP_TIMEOUT_S``); ``start()`` begins it early.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: _Process | None = None
        self._starting: Future[_Process | None] | None = None
        self._ever_ready = False
        self.starts = 0  # how many workers were started; tests and logs read it

    def start(self) -> None:
        """Begins starting the worker in the background (a no-op when one is running or starting)."""
        with self._lock:
            if self._process is None and self._starting is None:
                self._start_in_background()

    def compare(self, a_src: str, b_src: str, timeout_s: float) -> str:
        """EQUAL, NOT_EQUAL, PARSE_ERROR, TIMEOUT, TOO_COMPLEX, WORKER_BUSY or WORKER_ERROR.

        Never raises; returns within ``timeout_s`` plus the moment it takes to send a kill signal, plus
        the uncharged wait for this handle's first worker (``wait_for_first_start``).
        """
        deadline = time.monotonic() + max(timeout_s, 0.0)
        deadline += self.wait_for_first_start()
        if not self._lock.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
            return WORKER_BUSY
        try:
            process = self._ready_process(deadline)
            if not isinstance(process, _Process):
                return process
            return self._ask(process, a_src, b_src, deadline)
        finally:
            self._lock.release()

    @property
    def pid(self) -> int | None:
        with self._lock:
            return self._process.proc.pid if self._process is not None else None

    def wait_for_first_start(self) -> float:
        """Waits until this handle's first worker is ready (or failed to start); returns the seconds waited.

        Callers do not charge this wait to their time limit: the first start is not caused by any
        input, and a cold start on a loaded machine can take longer than a whole limit. Returns 0 at
        once when a worker has been ready before; later restarts are charged (see the class docstring).
        """
        if self._ever_ready:
            return 0.0
        start = time.monotonic()
        with self._lock:
            if not self._ever_ready:
                self._ready_process(start + STARTUP_TIMEOUT_S)
        return time.monotonic() - start

    def _ready_process(self, deadline: float) -> _Process | str:
        """The running worker, starting or awaiting one as needed; a verdict string when there is none."""
        if self._process is not None:
            if self._process.proc.poll() is None:
                return self._process
            self._process.close()  # died between requests (killed from outside, OOM killer)
            self._process = None
        if self._starting is None and not self._start_in_background():
            return WORKER_ERROR
        assert self._starting is not None
        try:
            process = self._starting.result(timeout=max(deadline - time.monotonic(), 0.0))
        except FutureTimeout:
            return WORKER_BUSY  # still starting; the next call picks it up
        self._starting = None
        if process is None:
            return WORKER_ERROR
        self._process, self._ever_ready = process, True
        return process

    def _start_in_background(self) -> bool:
        """Submits a start to the spawner thread; False when the interpreter is shutting down. Caller holds the lock."""
        try:
            self._starting = _spawner.submit(_launch)
        except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
            return False
        self.starts += 1
        return True

    def _ask(self, process: _Process, a_src: str, b_src: str, deadline: float) -> str:
        """One request to a ready worker; a worker that timed out or failed is replaced in the background."""
        try:
            process.requests.send((a_src, b_src))
            if not process.replies.poll(max(deadline - time.monotonic(), 0.0)):
                self._replace()
                return TIMEOUT
            verdict = process.replies.recv()
        except (EOFError, OSError):
            self._replace()
            return WORKER_ERROR
        if verdict == TOO_COMPLEX:  # MemoryError in the worker: start clean
            self._replace()
        return verdict if isinstance(verdict, str) else WORKER_ERROR

    def _replace(self) -> None:
        """Kills the current worker and starts its successor in the background. Caller holds the lock."""
        if self._process is not None:
            self._process.kill_and_reap_in_background()
            self._process = None
        if self._starting is None:
            self._start_in_background()

    def shutdown(self) -> None:
        """Asks the worker to exit, kills it if it does not, and any worker still starting; safe to repeat."""
        with self._lock:
            starting, self._starting = self._starting, None
            if starting is not None and not starting.cancel():
                starting.add_done_callback(_close_started)
            if self._process is not None:
                self._process.ask_to_exit()
                self._process = None

    def _forget_after_fork(self) -> None:
        # In a forked child the worker belongs to the parent: drop the handles, never kill it.
        # The spawner's thread did not survive the fork either, so the child gets a new one.
        global _spawner
        _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sympy-worker-spawner")
        self._lock = threading.Lock()
        if self._process is not None:
            for conn in (self._process.requests, self._process.replies):
                try:
                    conn.close()
                except OSError:
                    pass
        self._process, self._starting, self._ever_ready = None, None, False


def _close_started(future: Future[_Process | None]) -> None:
    """Done-callback for a start that ``shutdown`` could not cancel: the new worker is not wanted."""
    if not future.cancelled() and future.exception() is None:
        process = future.result()
        if process is not None:
            process.close()


_WORKER = SympyWorker()
atexit.register(_WORKER.shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WORKER._forget_after_fork)


def get_worker() -> SympyWorker:
    """The process-wide shared worker."""
    return _WORKER
