"""Engine tests run on both decode kernels: the static-KV forward and transformers' (the reference)."""

from __future__ import annotations

from functools import partialmethod

import pytest

from slime_ext.engine.embedded import EmbeddedEngine


@pytest.fixture(params=["static", "hf"])
def both_kernels(request, monkeypatch) -> str:
    """Every `EmbeddedEngine(...)` built in the test uses this kernel (in this process)."""
    monkeypatch.setattr(EmbeddedEngine, "__init__", partialmethod(EmbeddedEngine.__init__, kernel=request.param))
    return request.param
