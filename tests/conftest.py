"""Shared test setup: one torch thread (2-core machines), repo root on sys.path, repo paths."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
# One Ray auth mode for the whole test process: Ray caches the mode of the first session a process
# starts, and a later session started under another mode cancels its actors (the driver rejects the
# GCS's unauthenticated calls). Set before any test imports Ray.
os.environ["RAY_AUTH_MODE"] = "disabled"

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


@pytest.fixture
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def job_cache(tmp_path_factory) -> Path:
    """One `run.cache_dir` for the session's end-to-end jobs. Its data, tokenizers and SFT warm starts are keyed
    by what determines them (`slime_ext.tasks.prepare`, `build_embedded_tokenizer`, `TrainingJob.warm_start_key`),
    so a job whose settings match an earlier job's reuses them, as a user's second run does, instead of training
    the same tokenizer and warm start again. The first job of each key still builds them."""
    return tmp_path_factory.mktemp("job-cache")


def fake_our_subprocesses(monkeypatch: pytest.MonkeyPatch, handler: Callable[..., Any]) -> None:
    """Send the commands our code starts (`python -m slime_ext...`) to `handler`, every other `subprocess.run` to
    the real one: patching `subprocess.run` whole also caught a library's own call (matplotlib lists the fonts
    with `fc-list` on its first import on a fresh machine)."""
    real_run = subprocess.run

    def run(cmd: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(cmd, (list, tuple)) and len(cmd) > 2 and cmd[1] == "-m" and str(cmd[2]).startswith("slime_ext."):
            return handler(cmd, **kwargs)
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", run)
