"""Kill an engine server once a run has written its first metrics row (the e2e fault-injection tests)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

import psutil


def kill_server_after_step_0(runs: Path, matches: Callable[[str], bool]) -> tuple[threading.Thread, dict[str, int]]:
    """Start a thread that SIGKILLs the first `slime_ext.tools.serve` process whose command line `matches`, after
    `runs/*/metrics.jsonl` has a row; returns (thread, {"pid": killed pid} once done)."""
    killed: dict[str, int] = {}

    def watch() -> None:
        deadline = time.time() + 600
        while time.time() < deadline and not killed:
            metrics = list(runs.glob("*/metrics.jsonl"))
            if metrics and metrics[0].read_text().count("\n") >= 1:
                for proc in psutil.process_iter(["pid", "cmdline"]):
                    cmd = " ".join(proc.info["cmdline"] or [])
                    if "slime_ext.tools.serve" in cmd and matches(cmd):
                        os.kill(proc.info["pid"], signal.SIGKILL)
                        killed["pid"] = proc.info["pid"]
                        return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, killed
