"""What the two GPU profilers share: one profiled call, its top-operator tables, the report file."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch.profiler import ProfilerActivity, profile


def profiled(run: Callable[[], Any], device: str) -> tuple[Any, float]:
    """Run `run` under torch.profiler (CPU, and CUDA on a GPU); returns the operator averages and wall seconds."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        run()
        if device == "cuda":
            torch.cuda.synchronize()
    return prof.key_averages(), time.perf_counter() - start


def op_tables(events: Any, device: str, rows: int, width: int) -> str:
    """Top operators by self device time (by self CPU time on the CPU), then by self CPU time."""
    sort = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    return "\n".join([events.table(sort_by=sort, row_limit=rows, max_name_column_width=width),
                      events.table(sort_by="self_cpu_time_total", row_limit=rows * 2 // 3, max_name_column_width=width)])


def write_report(out: Optional[Path], filename: str, parts: list[str]) -> None:
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / filename).write_text("\n".join(parts) + "\n")
