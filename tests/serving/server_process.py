"""`python -m slime_ext.tools.serve` as a real process for tests: started on a free port, waited for, stopped."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from typing import Iterator

import httpx

from tests.conftest import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server_process(*flags: str, start_timeout_s: float = 120) -> Iterator[tuple[str, subprocess.Popen]]:
    """The server with `flags` (after `--port`); yields (url, process) once /health answers, terminates it after."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "slime_ext.tools.serve", "--port", str(port), *flags],
                            env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited: {proc.stderr.read().decode()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start within {start_timeout_s:g} s")
            time.sleep(0.1)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
