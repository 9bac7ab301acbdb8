"""Trainer-side weight sync to engine servers: disk, tensor or distributed (`sglang.weight_sync`).

Every path ends in the same state on every engine: the new weights loaded and the engine's weight
version set to the step's version (so each rollout says which weights produced it).

- disk: the weights are written once as HF safetensors (`write_snapshot`) and every engine is told to load
  them (`/update_weights_from_disk`). The snapshot is also the restore point of a restarted engine.
- tensor: `/update_weights_from_tensor` with the tensors serialized by sglang's MultiprocessingSerializer
  (CUDA IPC handles on a GPU node; on CPU, shared-memory file names: the `file_system` sharing strategy
  lets an unrelated process open them). For colocated engines on the trainer's node.
- distributed: once, rank 0 (this process) and every engine (`/init_weights_update_group`, ranks 1..N)
  join one process group with sglang's own `init_custom_process_group` (a `tcp://` store hosted by rank 0,
  keys prefixed by the group name; NCCL on GPUs, gloo on CPU), so the same calls reach real SGLang
  servers and the CPU stand-in; per sync, each engine is told names, dtypes and shapes
  (`/update_weights_from_distributed`) while rank 0 broadcasts the tensors in that order. A restarted
  engine breaks the group: the next sync builds a new one (under a new name: torch keeps group names
  for the life of a process).
Any engine's failure raises `WeightSyncError`: the loop stops rather than train on stale rollouts.
"""

from __future__ import annotations

import logging
import socket
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from slime_ext.engine.failures import WeightSyncError

log = logging.getLogger(__name__)
NamedTensors = list[tuple[str, torch.Tensor]]
GROUP_NAME = "weight_update_group"


def write_snapshot(directory: Path, named: NamedTensors) -> Path:
    """HF-named tensors as one safetensors file in `directory` (written to a temp name, then renamed,
    so a reader never sees half a file)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / "model.safetensors.tmp"
    save_file({n: t.detach().contiguous().cpu() for n, t in named}, str(tmp), metadata={"format": "pt"})
    tmp.replace(directory / "model.safetensors")
    return directory


def _on_all(clients: Sequence[Any], what: str, call: Callable[[int, Any], None]) -> None:
    """Run `call(i, client)` for every engine at once; raise one WeightSyncError naming each failure."""
    with ThreadPoolExecutor(max_workers=max(1, len(clients)), thread_name_prefix="weight-sync") as pool:
        futures = [pool.submit(call, i, c) for i, c in enumerate(clients)]
        errors = []
        for i, f in enumerate(futures):
            try:
                f.result()
            except Exception as exc:  # noqa: BLE001 - reported together below
                errors.append(f"engine {i} ({clients[i].base_url}): {type(exc).__name__}: {exc}")
    if errors:
        raise WeightSyncError(f"{what} failed: " + "; ".join(errors))


class DiskSync:
    name = "disk"

    def push(self, clients: Sequence[Any], named: NamedTensors, version: str, snapshot: Optional[Path]) -> None:
        assert snapshot is not None, "disk sync loads the snapshot written for this version"
        _on_all(clients, f"update_weights_from_disk (version {version})",
                lambda i, c: c.update_weights_from_disk(str(snapshot), weight_version=version))


class TensorSync:
    name = "tensor"

    def __init__(self) -> None:
        if not torch.cuda.is_available():
            # CPU tensors by shared-memory file name: the default (file descriptor) strategy needs the
            # receiver to be a multiprocessing child of this process, which an engine server is not.
            torch.multiprocessing.set_sharing_strategy("file_system")

    def push(self, clients: Sequence[Any], named: NamedTensors, version: str, snapshot: Optional[Path]) -> None:
        _on_all(clients, f"update_weights_from_tensor (version {version})",
                lambda i, c: c.update_weights_from_tensor(named, weight_version=version))


class DistributedSync:
    """Rank 0 of a weight-update group with every engine's ranks behind it."""

    name = "distributed"

    def __init__(self, host: str, tp_size: int = 1, timeout_s: float = 600.0):
        self.host = host
        self.tp_size = int(tp_size)
        self.timeout = timedelta(seconds=timeout_s)
        self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        self.group: Any = None
        self.members: tuple[str, ...] = ()
        self.generation = 0
        self.group_name = GROUP_NAME

    def invalidate(self) -> None:
        """Forget the group (an engine restarted: its ranks are gone); the next push builds a new one."""
        self.group = None
        self.members = ()

    def _ensure_group(self, clients: Sequence[Any]) -> None:
        urls = tuple(c.base_url for c in clients)
        if self.group is not None and urls == self.members:
            return
        from sglang.srt.utils.common import init_custom_process_group

        if self.generation:  # best effort: let the surviving engines drop the old group
            for c in clients:
                try:
                    c._control("/destroy_weights_update_group", {"group_name": self.group_name},
                               "DestroyWeightsUpdateGroupReqInput")
                except Exception as exc:  # noqa: BLE001
                    log.debug("destroy_weights_update_group on %s: %s", c.base_url, exc)
        self.generation += 1
        self.group_name = f"{GROUP_NAME}_{self.generation}"
        world = 1 + self.tp_size * len(clients)
        with socket.socket() as s:
            s.bind((self.host, 0))
            port = s.getsockname()[1]
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-group") as pool:
            joining = pool.submit(_on_all, clients, "init_weights_update_group",
                                  lambda i, c: c.init_weights_update_group(self.host, port, 1 + i * self.tp_size,
                                                                           world, self.group_name, self.backend))
            try:
                group = init_custom_process_group(backend=self.backend, init_method=f"tcp://{self.host}:{port}",
                                                  timeout=self.timeout, world_size=world, rank=0,
                                                  group_name=self.group_name)
            finally:
                joining.result()
        self.group, self.members = group, urls
        log.info("weight-update group: rank 0 here + %d engine rank(s) over %s", world - 1, self.backend)

    def push(self, clients: Sequence[Any], named: NamedTensors, version: str, snapshot: Optional[Path]) -> None:
        self._ensure_group(clients)
        names = [n for n, _ in named]
        dtypes = [t.dtype for _, t in named]
        shapes = [list(t.shape) for _, t in named]
        device = "cuda" if self.backend == "nccl" else "cpu"
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-announce") as pool:
            announced = pool.submit(_on_all, clients, f"update_weights_from_distributed (version {version})",
                                    lambda i, c: c.update_weights_from_distributed(names, dtypes, shapes, self.group_name,
                                                                                  weight_version=version))
            try:
                for _, t in named:
                    torch.distributed.broadcast(t.detach().to(device).contiguous(), src=0, group=self.group)
            except Exception as exc:  # an engine died mid-broadcast: its announce fails too
                self.invalidate()
                announced.cancel()
                raise WeightSyncError(f"broadcast of version {version} failed: {exc}") from exc
            announced.result()


def make_weight_sync(kind: str, host: str = "127.0.0.1", tp_size: int = 1, timeout_s: float = 600.0) -> Any:
    if kind == "disk":
        return DiskSync()
    if kind == "tensor":
        return TensorSync()
    if kind == "distributed":
        return DistributedSync(host, tp_size, timeout_s)
    raise ValueError(f"sglang.weight_sync={kind!r}: expected disk, tensor or distributed")


__all__ = ["DiskSync", "TensorSync", "DistributedSync", "make_weight_sync", "write_snapshot", "WeightSyncError"]
