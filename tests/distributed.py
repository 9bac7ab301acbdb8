"""Run a function on N local gloo ranks (spawned processes) and collect each rank's return value.

Each `run_ranks` call spawns its ranks (a process imports torch and megatron-core in seconds, far longer than
these tests' work), unless it runs inside `kept_ranks()`: there one set of rank processes per world size is
spawned once and runs every call in turn. Between calls a rank drops the call's Megatron parallel state and
every process group the call made (the world's group stays), so each call starts from a joined world with no
model-parallel groups, as a fresh spawn does. A call that fails ends its ranks (a rank left waiting in a
collective cannot be reused): the next call spawns new ones.
"""

from __future__ import annotations

import contextlib
import os
import queue
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

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


def _drop_call_state() -> None:
    """What a call leaves in a kept rank: Megatron's parallel state and the process groups it made."""
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    world = dist.GroupMember.WORLD
    for group in list(dist.distributed_c10d._world.pg_map):
        if group is not world:
            dist.destroy_process_group(group)


def _serve(rank: int, world_size: int, port: int, inbox: Any, outbox: Any) -> None:
    """A kept rank: join the world once, then run each call `inbox` brings until it brings None."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    from megatron_glue.parallel import init_distributed, teardown

    init_distributed(rank=rank, world_size=world_size, master_port=port)
    while (call := inbox.get()) is not None:
        call_dir = Path(call)
        try:
            fn, args = torch.load(call_dir / "call.pt", weights_only=False)
            result = fn(rank, *args)
            _drop_call_state()
            torch.save({"ok": result}, call_dir / f"rank{rank}.pt")
            outbox.put((rank, None))
        except BaseException:
            outbox.put((rank, traceback.format_exc()))
            return  # the other ranks may wait in a collective of this call: the pool ends these processes
    teardown()


class _KeptRanks:
    """`world_size` rank processes that run one call after another (`kept_ranks`)."""

    def __init__(self, world_size: int):
        from megatron_glue.parallel import free_port

        ctx = mp.get_context("spawn")
        self.world_size = world_size
        self.inboxes = [ctx.SimpleQueue() for _ in range(world_size)]
        self.outbox = ctx.Queue()
        port = free_port()
        self.procs = [ctx.Process(target=_serve, args=(r, world_size, port, self.inboxes[r], self.outbox), daemon=True)
                      for r in range(world_size)]
        for p in self.procs:
            p.start()

    def run(self, fn: Callable, args: tuple) -> list[Any]:
        with tempfile.TemporaryDirectory() as call_dir:
            torch.save((fn, args), Path(call_dir) / "call.pt")
            for inbox in self.inboxes:
                inbox.put(call_dir)
            done: set[int] = set()
            errors: dict[int, str] = {}
            first_error: Optional[float] = None
            while len(done) + len(errors) < self.world_size:
                try:
                    rank, error = self.outbox.get(timeout=2)
                except queue.Empty:
                    dead = [r for r, p in enumerate(self.procs) if not p.is_alive() and r not in errors]
                    waited = first_error is not None and time.monotonic() - first_error > 10
                    if dead or waited:  # a crashed rank, or ranks left in a collective by a failed one
                        errors.update({r: "the rank process died" for r in dead})
                        break
                    continue
                if error is None:
                    done.add(rank)
                else:
                    errors[rank] = error
                    first_error = first_error or time.monotonic()
            if errors:
                self.close()
                raise RuntimeError("\n".join(f"rank {r}:\n{e}" for r, e in sorted(errors.items())))
            return [torch.load(Path(call_dir) / f"rank{r}.pt", weights_only=False)["ok"]
                    for r in range(self.world_size)]

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def close(self) -> None:
        for p, inbox in zip(self.procs, self.inboxes):
            if p.is_alive():
                inbox.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()


_KEPT: Optional[dict[int, _KeptRanks]] = None  # world size -> ranks, inside `kept_ranks()` only


@contextlib.contextmanager
def kept_ranks() -> Iterator[None]:
    """Inside: `run_ranks` reuses one set of rank processes per world size (spawned at its first call)."""
    global _KEPT
    outer, _KEPT = _KEPT, {}
    try:
        yield
    finally:
        for ranks in _KEPT.values():
            ranks.close()
        _KEPT = outer


def run_ranks(fn: Callable, world_size: int, *args: Any) -> list[Any]:
    """`fn(rank, *args)` on `world_size` processes; re-raises the first rank's error with its traceback."""
    from megatron_glue.parallel import free_port

    if _KEPT is not None:
        ranks = _KEPT.get(world_size)
        if ranks is None or not ranks.alive():
            ranks = _KEPT[world_size] = _KeptRanks(world_size)
        return ranks.run(fn, args)
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
