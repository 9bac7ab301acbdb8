"""The package's multi-process tests (`tests.distributed.run_ranks`) share their rank processes: spawned once per
world size for the package instead of once per test (each spawn imports torch and megatron-core)."""

from __future__ import annotations

import pytest

from tests.distributed import kept_ranks


@pytest.fixture(scope="package", autouse=True)
def _kept_ranks():
    with kept_ranks():
        yield
