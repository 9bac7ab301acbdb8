"""The sympy worker must not outlive its parent (issue 15, item 7), even in the middle of a computation."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
# The parent starts a worker, prints its pid, sets it on a long computation, then waits to be killed.
PARENT = (
    "import sys, threading, time\n"
    "from slime_ext.rewards.sympy_worker import get_worker\n"
    "w = get_worker()\n"
    "assert w.compare('x', 'x', 60.0) == 'equal'\n"
    "print(w.pid, flush=True)\n"
    "busy = '(' + '+'.join(f'x**{i}*y**{j}' for i in range(40) for j in range(40)) + ')**9'\n"
    "threading.Thread(target=w.compare, args=(busy, 'z', 600.0), daemon=True).start()\n"
    "time.sleep(600)\n"
)


@pytest.mark.timeout(120)
def test_worker_dies_with_its_killed_parent() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, env=env, cwd=REPO)
    worker_pid = None
    try:
        assert parent.stdout is not None
        worker_pid = int(parent.stdout.readline())
        worker = psutil.Process(worker_pid)
        time.sleep(1.0)  # the worker is now busy inside sympy, not waiting on its pipe
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        gone, alive = psutil.wait_procs([worker], timeout=5)
        assert alive == [], f"worker {worker_pid} outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        if worker_pid is not None:
            try:
                os.kill(worker_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.timeout(60)
def test_worker_survives_the_short_lived_thread_that_started_it() -> None:
    """The parent-death signal follows the forking *thread*; workers are forked from a long-lived one."""
    import threading

    from slime_ext.rewards.sympy_worker import SympyWorker

    worker = SympyWorker()
    try:
        thread = threading.Thread(target=worker.compare, args=("x+1", "1+x", 60.0))
        thread.start()
        thread.join()
        pid = worker.pid
        time.sleep(0.5)
        assert pid is not None and psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        assert worker.compare("2x", "x+x", 30.0) == "equal"
        assert worker.pid == pid and worker.starts == 1
    finally:
        worker.shutdown()


@pytest.mark.timeout(120)
def test_shutdown_during_a_background_start_leaves_no_worker() -> None:
    """A worker still starting when ``shutdown`` runs (e.g. at exit, right after a timeout) is killed once ready."""
    from slime_ext.rewards.sympy_worker import SympyWorker

    worker = SympyWorker()
    worker.start()
    starting = worker._starting
    assert starting is not None
    worker.shutdown()
    if not starting.cancelled():
        process = starting.result(timeout=100)
        assert process is not None
        assert process.proc.wait(timeout=10) is not None  # killed by shutdown's done-callback
    assert worker.pid is None
