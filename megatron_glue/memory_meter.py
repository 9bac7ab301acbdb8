"""Peak bytes held by torch tensors during a piece of work, on CPU and GPU, to hold the memory plan against.

GPU: the CUDA caching allocator's own counters (`max_memory_allocated`). CPU: torch has no such counter, so the
tensors alive at the start are summed (unique storages reachable from Python) and the allocator's events
during the work are replayed from torch.profiler (`profile_memory=True`): every allocation and free in order,
the running sum's maximum being the peak. Both count tensor bytes only, which is what the plan estimates
(not the Python heap, not allocator caching or fragmentation).
"""

from __future__ import annotations

import gc
from typing import Any, Optional

import torch


def live_tensor_bytes(device: str = "cpu") -> int:
    """Bytes of the distinct tensor storages on `device` that Python objects reach now."""
    seen: set[int] = set()
    total = 0
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, torch.Tensor) or obj.device.type != device:
                continue
            storage = obj.untyped_storage()
        except Exception:  # noqa: BLE001 - objects that fail isinstance or have no storage (meta, sparse)
            continue
        key = storage.data_ptr()
        if key and key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


class PeakMemory:
    """`with PeakMemory() as m: work()` then `m.peak_bytes` (tensors alive at the start included),
    `m.start_bytes` and `m.growth_bytes` (peak minus start)."""

    def __init__(self, device: Optional[str] = None):
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.start_bytes = 0
        self.peak_bytes = 0
        self._profiler: Any = None

    @property
    def growth_bytes(self) -> int:
        return self.peak_bytes - self.start_bytes

    def __enter__(self) -> "PeakMemory":
        gc.collect()
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start_bytes = torch.cuda.memory_allocated()
        else:
            from torch.profiler import ProfilerActivity, profile

            self.start_bytes = live_tensor_bytes("cpu")
            self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._profiler.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated()
            return
        self._profiler.__exit__(*exc)
        # the raw records: FunctionEvents fold allocations made inside an operator into that operator
        events = sorted((e for e in self._profiler.profiler.kineto_results.events()
                         if e.name() == "[memory]" and e.device_type().name == "CPU"), key=lambda e: e.start_ns())
        live = peak = 0
        for event in events:
            live += event.nbytes()
            peak = max(peak, live)
        self.peak_bytes = self.start_bytes + peak
        self._profiler = None
