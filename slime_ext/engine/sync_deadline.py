"""How long one weight sync may take before the run stops (`sglang.weight_sync_timeout_s`).

Why a deadline at all: a sync is collective (every trainer rank gathers, the senders push, every engine
applies), so one hung engine or one rank that never sends would otherwise hang the whole run with no word.
The derived default leaves a wide margin over the slowest path the plan assumes (a filesystem or one NIC
at about 1 GB/s): 120 s plus ten times the model's bytes at that rate (Qwen3-30B-A3B in bf16, 61 GB: ~12 min;
the tiny CPU models: 120 s).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

BASE_S = 120.0
ASSUMED_BYTES_PER_S = 1e9
MARGIN = 10.0


def derived_deadline_s(model_bytes: int) -> float:
    return BASE_S + MARGIN * model_bytes / ASSUMED_BYTES_PER_S


def checkpoint_bytes(model_dir: Optional[str | Path]) -> int:
    """The bytes of a checkpoint's safetensors files (0 when there are none)."""
    if model_dir is None or not Path(model_dir).is_dir():
        return 0
    return sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))


def sync_deadline_s(timeout_s: Optional[float], model_dir: Optional[str | Path]) -> float:
    """`sglang.weight_sync_timeout_s` when set, else derived from the checkpoint the engines serve."""
    return float(timeout_s) if timeout_s is not None else derived_deadline_s(checkpoint_bytes(model_dir))


__all__ = ["sync_deadline_s", "derived_deadline_s", "checkpoint_bytes"]
