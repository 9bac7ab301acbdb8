"""What the engines hold of this process's own weights, kept for delta sync (`sglang.weight_sync_delta`).

Every trainer rank keeps a copy of its *own shard* in the engines' dtype, recorded after each push; at the
next push the rank gathers that copy with its current weights (`iter_hf_weight_bucket_pairs`), so the stage's
sender gets the engines' values bucket by bucket and compares after the gathers. Why not a copy on the
sender: that copy is the whole pipeline stage after the TP and expert gathers (at 30B with PP 1, 61 GB of
bf16 on one process), while a copy of the own shard is 1 / (TP x EP) of it on each rank. Rounding to the
engines' dtype is elementwise, so the shard's copy gathered equals the gathered tensors' copy.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

_HELD: dict[str, "HeldWeights"] = {}


class HeldWeights:
    """A copy of named tensors in one dtype (None: each tensor's own), in one flat buffer per dtype and
    device. Why flat: thousands of long-lived small copies between a sync's transient buffers keep the
    allocator's heap from giving freed memory back (measured: 1.1-1.5 GiB of growth at 556M)."""

    def __init__(self, dtype: Optional[torch.dtype]):
        self.dtype = dtype
        self.values: dict[str, torch.Tensor] = {}

    def matches(self, named: Mapping[str, torch.Tensor]) -> bool:
        """True when a copy of exactly these names, shapes and devices is held."""
        if set(named) != set(self.values):
            return False
        return all(self.values[n].shape == t.shape and self.values[n].device == t.device
                   and self.values[n].dtype == (self.dtype or t.dtype) for n, t in named.items())

    def record(self, named: Mapping[str, torch.Tensor]) -> None:
        """Copies `named` (the values the engines now hold), allocating only when the layout changed."""
        if not self.matches(named):
            self.values = {}
            wanted: dict[tuple[torch.dtype, torch.device], list[tuple[str, torch.Size]]] = {}
            for name, tensor in named.items():
                wanted.setdefault((self.dtype or tensor.dtype, tensor.device), []).append((name, tensor.shape))
            for (dtype, device), items in wanted.items():
                flat = torch.empty(sum(shape.numel() for _, shape in items), dtype=dtype, device=device)
                at = 0
                for name, shape in items:
                    self.values[name] = flat[at:at + shape.numel()].view(shape)
                    at += shape.numel()
        with torch.no_grad():
            for name, tensor in named.items():
                self.values[name].copy_(tensor.detach())

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.values.values())


def target_dtype(target: Any) -> Optional[torch.dtype]:
    """The engines' dtype of a weight-sync target (None: the weights' own)."""
    return getattr(torch, target.engine_dtype) if target.engine_dtype else None


def held_weights(target: Any, key: str) -> Optional[HeldWeights]:
    """This process's copy for `target` (created empty on first use) when the target syncs by delta and
    its transport carries deltas; None otherwise, and a copy kept from earlier is dropped (a full sync:
    what the engines hold afterwards is re-recorded by the next delta sync)."""
    name = f"{key}|{target.identity}"
    if not (target.delta and target.carries_deltas):
        _HELD.pop(name, None)
        return None
    dtype = target_dtype(target)
    held = _HELD.get(name)
    if held is None or held.dtype != dtype:
        held = _HELD[name] = HeldWeights(dtype)
    return held


def forget_held_weights() -> None:
    """Drop every copy (tests; a trainer that reloads its weights)."""
    _HELD.clear()
