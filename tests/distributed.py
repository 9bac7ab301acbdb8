"""Run a function on N local gloo ranks (spawned processes) and collect each rank's return value."""

from __future__ import annotations

import os
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
import torch.multiprocessing as mp


def _entry(rank: int, fn: Callable, world_size: int, port: int, out_dir: str, args: tuple) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    try:
        from megatron_glue.parallel import init_distributed, teardown

        init_distributed(rank=rank, world_size=world_size, master_port=port)
        result = fn(rank, *args)
        teardown()
        torch.save({"ok": result}, Path(out_dir) / f"rank{rank}.pt")
    except BaseException:
        torch.save({"error": traceback.format_exc()}, Path(out_dir) / f"rank{rank}.pt")
        raise


def run_ranks(fn: Callable, world_size: int, *args: Any) -> list[Any]:
    """`fn(rank, *args)` on `world_size` processes; re-raises the first rank's error with its traceback."""
    from megatron_glue.parallel import free_port

    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(_entry, args=(fn, world_size, free_port(), out_dir, args), nprocs=world_size,
                                 join=False, start_method="spawn")
        try:
            while not ctx.join(timeout=300):
                pass
        except Exception as exc:
            errors = []
            for r in range(world_size):
                path = Path(out_dir) / f"rank{r}.pt"
                if path.exists() and "error" in (res := torch.load(path, weights_only=False)):
                    errors.append(f"rank {r}:\n{res['error']}")
            raise RuntimeError("\n".join(errors) or str(exc)) from None
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False)["ok"] for r in range(world_size)]
