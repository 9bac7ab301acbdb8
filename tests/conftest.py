"""Shared test setup: one torch thread (2-core machines), repo root on sys.path, repo paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


@pytest.fixture
def repo_root() -> Path:
    return REPO
