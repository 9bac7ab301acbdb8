"""Shared test setup: one torch thread (2-core machines), repo root on sys.path, repo paths."""

from __future__ import annotations

import os
from pathlib import Path

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
