"""Weights from the trainer ranks to the engines, bucket by bucket, never through the driver.

The driver builds a *target* (a small picklable description: which engines, which transport, the engines'
dtype, delta or not) and hands it to every trainer rank; the ranks that hold complete buckets after the
TP / expert gathers (one per pipeline stage: TP, EP and DP rank 0) open a *sender* from it and pass their
buckets to it as `megatron_glue.weight_export.iter_hf_weight_buckets` yields them. Tensors go from those
ranks straight to the engines; the driver then sends control messages only (the version, the disk index).

Transports (`sglang.weight_sync`):
- disk: each sender writes one safetensors file per bucket into the version's directory and returns its
  names; the driver writes `model.safetensors.index.json` and tells the engines to load the directory.
- tensor: each bucket goes to `/update_weights_from_tensor` as SGLang takes it from slime: HF-named tensors in
  SGLang's own `FlattenedTensorBucket`, serialised with its `MultiprocessingSerializer`, one copy per engine TP
  rank, `load_format="flattened_bucket"`, so the engine's own model `load_weights` maps the names onto its
  fused parameters (qkv_proj, gate_up_proj, FusedMoE w13 / w2; held to SGLang's Qwen3-MoE by
  tests/engine/test_sglang_model_contract.py). With `sglang.weight_sync_delta` a bucket is a checksummed
  payload of sparse deltas instead (`sglang_patches.weight_payload`, applied by that module's custom weight
  loader), which only the project's server takes: SGLang's fused parameters have no HF-named tensor to patch,
  so GPU runs refuse delta sync at validation. CUDA IPC handles on a GPU node; on CPU, shared-memory file
  names (the `file_system` sharing strategy lets an unrelated process open them).
- distributed: each sender is rank 0 of its own weight-update group with every engine's ranks behind it
  (SGLang's `init_custom_process_group`: a `tcp://` store on the sender's node address, NCCL on GPUs, gloo
  on CPU); per bucket it announces names, dtypes and shapes (`/update_weights_from_distributed`,
  `flattened_bucket`) and broadcasts one flat tensor from the device where the weights live. A restarted
  engine breaks the groups: the driver bumps the target's `generation` and the senders build new ones.
- the embedded engine actor: each bucket is a checksummed payload passed to the actor by Ray (an object
  the driver never dereferences).
Any engine's failure raises `WeightSyncError`: the loop stops rather than train on stale or corrupt weights.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from sglang_patches import weight_payload
from slime_ext.engine.failures import WeightSyncError
from slime_ext.engine.held_weights import forget_held_weights, held_weights, target_dtype
from sglang_patches.weight_hash import tensor_hash_hex

log = logging.getLogger(__name__)
NamedTensors = list[tuple[str, torch.Tensor]]
# a payload wire gets each bucket in about this many parts (see Sender.send)
PAYLOAD_PARTS = 4
GROUP_NAME = "weight_update_group"
INDEX_FILE = "model.safetensors.index.json"


# -- memory and addresses ------------------------------------------------------------------------
_LIBC: Any = None


def return_freed_memory() -> None:
    """Give the C heap's free pages back to the OS (glibc `malloc_trim`; a no-op elsewhere). Why: tensors
    under glibc's mmap threshold live in the heap, which keeps what they freed; without a trim between
    buckets a push's resident memory ratchets up to the heap's high-water mark across buckets (measured: a
    sender's first sync grew 2x its two buckets), and an OOM killer reads resident memory, not live bytes."""
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim  # noqa: B018 - glibc only
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


def rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


class PeakRSS:
    """Samples this process's RSS in a thread while the body runs: `peak - start` is what the body added.
    Setting `phase` attributes the samples taken from then on to that phase (`phase_peaks`): where a peak
    happened, e.g. a weight push's gathers against its sends."""

    def __init__(self, interval_s: float = 0.005):
        self.interval_s = interval_s
        self.start = self.peak = 0
        self.phase: Optional[str] = None
        self.phase_peaks: dict[str, int] = {}
        self._stop = threading.Event()

    def __enter__(self) -> "PeakRSS":
        self.start = self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        rss, phase = rss_bytes(), self.phase
        self.peak = max(self.peak, rss)
        if phase is not None:
            self.phase_peaks[phase] = max(self.phase_peaks.get(phase, 0), rss)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def growth(self, phase: Optional[str] = None) -> int:
        """The largest RSS above the start level, over the whole body or in one phase (0 if never sampled)."""
        top = self.peak if phase is None else self.phase_peaks.get(phase, self.start)
        return max(0, top - self.start)


def node_address() -> str:
    """This process's node address as Ray knows it (never assumed to be 127.0.0.1), else the loopback."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - outside Ray
        pass
    return "127.0.0.1"


def on_all_engines(clients: Sequence[Any], what: str, call: Callable[[int, Any], None]) -> None:
    """Run `call(i, client)` for every engine at once; raise one WeightSyncError naming each failure."""
    with ThreadPoolExecutor(max_workers=max(1, len(clients)), thread_name_prefix="weight-sync") as pool:
        futures = [pool.submit(call, i, c) for i, c in enumerate(clients)]
        errors = []
        for i, f in enumerate(futures):
            try:
                f.result()
            except Exception as exc:  # noqa: BLE001 - reported together below
                errors.append(f"engine {i} ({getattr(clients[i], 'base_url', clients[i])}): {type(exc).__name__}: {exc}")
    if errors:
        raise WeightSyncError(f"{what} failed: " + "; ".join(errors))


# -- what a sender keeps between syncs (per trainer-rank process) --------------------------------
@dataclass
class _SenderMemory:
    groups: dict[tuple, "DistributedGroup"] = field(default_factory=dict)


_MEMORY: dict[str, _SenderMemory] = {}
_GROUP_COUNT = itertools.count()


def _memory(key: str) -> _SenderMemory:
    return _MEMORY.setdefault(key, _SenderMemory())


def forget_sender_state() -> None:
    """Drop every sender's groups and this process's delta copies (tests; a trainer that reloads its
    weights)."""
    for memory in _MEMORY.values():
        for group in memory.groups.values():
            group.destroy()
    _MEMORY.clear()
    forget_held_weights()


# -- targets (driver side, picklable) ------------------------------------------------------------
@dataclass
class EmbeddedTarget:
    """The embedded engine actor: payloads handed over by Ray."""

    handle: Any
    engine_dtype: str = "float32"
    delta: bool = False
    kind: str = "embedded"
    identity: str = "embedded"
    carries_deltas: bool = True  # payloads carry sparse deltas
    timeout_s: Optional[float] = None  # the sync's deadline (sglang.weight_sync_timeout_s); None: none

    def open(self, key: str) -> "Sender":
        return Sender(self, key, _EmbeddedWire(self.handle, self.timeout_s))


@dataclass
class ServerTarget:
    """Engine servers at `urls`, reached by `kind` (disk / tensor / distributed)."""

    kind: str
    urls: list[str]
    engine_dtype: Optional[str] = "float32"
    delta: bool = False
    tp_size: int = 1
    directory: Optional[str] = None  # disk: the version's shard directory
    generation: str = "0"  # distributed: a new token when an engine restarted (new groups)
    timeout_s: float = 600.0
    client_kwargs: dict = field(default_factory=dict)
    # hash what is sent (dense paths), for engines whose weight checker reports the same tensors (the project's
    # server on CPU: HF names, one rank); SGLang's own engines fuse and shard them, and hash on the GPU
    sender_checksums: bool = False
    # one sender per EP rank for its own experts besides the stage's dense sender (sglang.expert_senders); the
    # disk and distributed paths take several senders' parts of one sync, the tensor path one sender per stage
    expert_senders: bool = False
    # the driver holds the engines' weight-update session around the whole sync (SGLang allows one open session
    # per server: several senders each opening their own would refuse each other); False: one per call
    session_open: bool = False
    # colocated refit as slime does it (tensor, dense): every trainer rank sends its own copy of each bucket, and
    # each engine TP rank reads the copy of the trainer rank on its own device; used when the trainer's ranks
    # are exactly the engines' ranks (one pipeline stage, world = engines x TP), one sender per stage otherwise
    rank_engines: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("disk", "distributed"):
            self.expert_senders = False

    @property
    def identity(self) -> str:
        return f"{self.kind}:{','.join(self.urls)}"

    @property
    def carries_deltas(self) -> bool:
        """Only `/update_weights_from_tensor` payloads carry sparse deltas (disk and NCCL send dense)."""
        return self.kind == "tensor"

    def clients(self) -> list[Any]:
        from slime_ext.engine.sglang_client import SGLangEngineClient

        # tp_size: a tensor update carries one serialized copy per engine TP rank (each rank reads its own)
        kwargs = {"tp_size": self.tp_size, **self.client_kwargs}
        clients = [SGLangEngineClient(u, timeout_s=self.timeout_s, max_retries=0, **kwargs) for u in self.urls]
        for client in clients:
            client._in_weight_session = self.session_open  # the driver's session covers this sender's calls
        return clients

    def engine_ranks(self) -> int:
        return len(self.urls) * self.tp_size

    def per_engine_rank(self, world: int, stages: int) -> bool:
        """Whether every trainer rank sends, each to the engine rank on its own device (`rank_engines`)."""
        return (self.rank_engines and self.kind == "tensor" and not self.delta and stages == 1
                and world == self.engine_ranks())

    def open_rank(self, rank: int) -> "Sender":
        """Trainer rank `rank`'s sender to the engine whose TP rank `rank % tp_size` shares its device (the ranks
        of engine e are e x TP ... e x TP + TP - 1, as the colocated placement packs them)."""
        engine, own = divmod(rank, self.tp_size)
        return Sender(self, f"rank{rank}", _EngineRankWire(self.clients()[engine], own, self.tp_size))

    def open(self, key: str) -> "Sender":
        if self.kind == "disk":
            wire: Any = _DiskWire(Path(self.directory or "."), key)
        elif self.kind == "tensor":
            wire = _TensorWire(self.clients(), self.delta)
        elif self.kind == "distributed":
            wire = _DistributedWire(self, key)
        else:
            raise ValueError(f"sglang.weight_sync={self.kind!r}: expected disk, tensor or distributed")
        return Sender(self, key, wire)


# -- the sender: encodes buckets and counts ------------------------------------------------------
TRIM_EVERY_BYTES = 64 << 20


def converted(bucket: NamedTensors, dtype: Optional[torch.dtype],
              checksums: Optional[dict[str, str]] = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The bucket's tensors in `dtype` (None: as they are), one at a time, each source popped from the list
    first: a source tensor is freed as soon as its converted copy exists (the caller's list ends empty), and
    the heap is trimmed after every 64 MiB of freed sources, so the pages of the bucket's already-sent part
    leave the process while the rest is sent (freed small tensors otherwise stay resident until the bucket
    ends: `return_freed_memory`)."""
    bucket.reverse()
    freed = 0
    while bucket:
        name, tensor = bucket.pop()
        value = tensor.detach() if dtype is None else tensor.detach().to(dtype)
        freed += tensor.numel() * tensor.element_size()
        del tensor
        if freed >= TRIM_EVERY_BYTES:
            return_freed_memory()
            freed = 0
        if checksums is not None:  # what the sender sent, hashed as SGLang's weight checker hashes (CPU)
            checksums[name] = tensor_hash_hex(value)
        yield name, value


class Sender:
    """One trainer rank's end of a sync: converts each bucket to the engines' dtype, encodes it (dense or
    delta, with checksums where the transport carries them) and hands it to the wire."""

    def __init__(self, target: Any, key: str, wire: Any):
        self.target, self.key, self.wire = target, key, wire
        self.dtype = target_dtype(target)  # None: as trained
        self.memory = _memory(f"{key}|{target.identity}")
        self.delta = bool(target.delta) and target.carries_deltas
        self.stats = {"tensors": 0, "elements": 0, "changed": 0, "bytes_full": 0, "bytes_sent": 0, "buckets": 0,
                      "payloads": 0, "seconds": 0.0}
        # dense wires hash what they send when the engines hold the same layout (`sender_checksums`)
        self.checksums: Optional[dict[str, str]] = {} if getattr(target, "sender_checksums", False) else None
        wire.checksums = self.checksums
        self.t0 = time.perf_counter()

    def send(self, bucket: NamedTensors, before: Optional[NamedTensors] = None) -> None:
        """Takes the bucket's tensors out of the list as it converts them, so each source tensor is freed as
        soon as its engine-dtype copy exists (the caller's list is empty afterwards). Payload wires get the
        bucket in parts of about a quarter of its engine-dtype bytes, each tensor converted and encoded only
        when its part is built: the sender never holds a whole converted bucket plus its whole payload (plus
        the transport's copy of it) on top of the gathered bucket. `before`: what the engines hold of the
        bucket's tensors, in their dtype (`held_weights`); with delta sync on, a tensor found there is sent
        as its changed elements, any other dense."""
        elements = sum(t.numel() for _, t in bucket)
        full = sum(t.numel() * (self.dtype or t.dtype).itemsize for _, t in bucket)
        self.stats["buckets"] += 1
        self.stats["tensors"] += len(bucket)
        self.stats["elements"] += elements
        self.stats["bytes_full"] += full
        if not self.wire.payloads:  # plain tensors: everything is sent, as one bucket
            self.stats["changed"] += elements
            self.stats["bytes_sent"] += full
            self.wire.send_bucket(bucket, self.dtype)
            return
        part_bytes = max(1, full // PAYLOAD_PARTS)
        held = dict(before) if self.delta and before else {}
        if before:
            before.clear()
        payload: NamedTensors = []
        pending = 0
        for name, value in converted(bucket, self.dtype):
            entries, changed = weight_payload.encode(name, value, held.pop(name, None))
            self.stats["changed"] += changed
            del value
            payload += entries
            pending += weight_payload.payload_bytes(entries)
            del entries
            if pending >= part_bytes:
                self._send_payload(payload)
                payload, pending = [], 0
        if payload:
            self._send_payload(payload)

    def _send_payload(self, payload: NamedTensors) -> None:
        self.stats["bytes_sent"] += weight_payload.payload_bytes(payload)
        self.stats["payloads"] += 1
        self.wire.send(payload)

    def close(self) -> dict:
        extra = self.wire.close()
        self.stats["seconds"] = time.perf_counter() - self.t0
        if self.checksums is not None:
            extra["checksums"] = self.checksums
        return {**self.stats, **extra, "sender": self.key, "delta": int(self.delta)}


class _EmbeddedWire:
    payloads = True
    checksums: Optional[dict[str, str]] = None  # payloads carry their own checksums

    def __init__(self, handle: Any, timeout_s: Optional[float] = None):
        self.handle, self.timeout_s = handle, timeout_s

    def send(self, payload: NamedTensors) -> None:
        apply = self.handle.apply_weight_payload
        try:
            if hasattr(apply, "remote"):  # the actor (the payload travels as a Ray object)
                import ray

                ray.get(apply.remote(payload), timeout=self.timeout_s)
            else:  # an engine in this process (tests, tools)
                apply(payload)
        except Exception as exc:  # noqa: BLE001 - a checksum mismatch, a dead actor
            raise WeightSyncError(f"the embedded engine refused a weight bucket: {exc}") from exc

    def close(self) -> dict:
        return {}


class _DiskWire:
    """One safetensors file per bucket in the version's directory; the driver writes the index."""

    payloads = False
    checksums: Optional[dict[str, str]] = None

    def __init__(self, directory: Path, key: str):
        self.directory, self.key = directory, key
        self.directory.mkdir(parents=True, exist_ok=True)
        self.weight_map: dict[str, str] = {}
        self.count = 0

    def send_bucket(self, bucket: NamedTensors, dtype: Optional[torch.dtype]) -> None:
        from safetensors.torch import save_file

        named = [(n, t.contiguous().cpu()) for n, t in converted(bucket, dtype, self.checksums)]
        fname = f"model-{self.key}-{self.count:05d}.safetensors"
        tmp = self.directory / f".{fname}.tmp"
        save_file(dict(named), str(tmp), metadata={"format": "pt"})
        tmp.replace(self.directory / fname)  # a reader never sees half a file
        self.weight_map.update({n: fname for n, _ in named})
        self.count += 1

    def close(self) -> dict:
        return {"weight_map": self.weight_map}


def flat_bucket(bucket: NamedTensors, dtype: Optional[torch.dtype], device: torch.device,
                checksums: Optional[dict[str, str]] = None) -> tuple[torch.Tensor, list]:
    """The bucket as one flat byte tensor on `device` and its (name, shape, dtype, start, end) entries, each
    tensor converted to `dtype` (None: as it is) as it is copied into its slice and popped from `bucket`. Why
    not convert the bucket, then concatenate: that held the converted bucket and its flat copy at once
    (measured at 556M, TP 2 / EP 2: the sender grew 1.2 GiB in a sync with 512 MiB buckets)."""
    dtypes = [dtype or t.dtype for _, t in bucket]
    flat = torch.empty(sum(t.numel() * d.itemsize for (_, t), d in zip(bucket, dtypes)), dtype=torch.uint8,
                       device=device)
    entries, at = [], 0
    for (name, value), value_dtype in zip(converted(bucket, dtype, checksums), dtypes):
        size = value.numel() * value.element_size()
        flat[at:at + size].copy_(value.to(device).contiguous().view(-1).view(torch.uint8))
        entries.append((name, value.shape, value_dtype, at, at + size))
        at += size
        del value
    return flat, entries


def ipc_device() -> torch.device:
    """Where a bucket handed to another process by handle lives: this rank's GPU (CUDA IPC), else the host,
    shared by file name: the default (file descriptor) strategy needs the receiver to be a multiprocessing child
    of this process, which an engine server is not."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    torch.multiprocessing.set_sharing_strategy("file_system")
    return torch.device("cpu")


def sglang_flattened_bucket(flat: torch.Tensor, entries: list) -> dict[str, Any]:
    """`flat_bucket`'s output as SGLang's own `FlattenedTensorBucket` hands it to `update_weights_from_tensor`
    with `load_format="flattened_bucket"` (its weight updater rebuilds the tensors from exactly these keys)."""
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket, FlattenedTensorMetadata

    metadata = [FlattenedTensorMetadata(name=name, shape=torch.Size(shape), dtype=dtype, start_idx=start,
                                        end_idx=end, numel=end - start) for name, shape, dtype, start, end in entries]
    bucket = FlattenedTensorBucket(flattened_tensor=flat, metadata=metadata)
    return {"flattened_tensor": bucket.get_flattened_tensor(), "metadata": bucket.get_metadata()}


class _TensorWire:
    """Dense: SGLang's flattened bucket through the engine's own loader. Delta: checksummed payloads through
    the custom loader of `sglang_patches.weight_payload` (the project's server only)."""

    checksums: Optional[dict[str, str]] = None

    def __init__(self, clients: list[Any], delta: bool = False):
        self.clients = clients
        self.payloads = delta
        self.device = ipc_device()

    def send(self, payload: NamedTensors) -> None:
        on_all_engines(self.clients, "update_weights_from_tensor",
                lambda i, c: c.update_weights_from_tensor(payload, load_format=weight_payload.LOADER))

    def send_bucket(self, bucket: NamedTensors, dtype: Optional[torch.dtype]) -> None:
        flattened = sglang_flattened_bucket(*flat_bucket(bucket, dtype, self.device, self.checksums))
        on_all_engines(self.clients, "update_weights_from_tensor (flattened_bucket)",
                       lambda i, c: c.update_weights_from_flattened_bucket(flattened))

    def close(self) -> dict:
        return {}


class _EngineRankWire:
    """One trainer rank's part of a colocated refit: it serialises its own copy of the bucket (a CUDA IPC handle
    to its own device; shared memory on CPU), the engine's ranks exchange theirs (`all_gather_object` over the
    trainer's ranks, in lockstep per bucket), and the engine's first rank posts them, entry i for engine TP rank
    i. Every rank then learns whether each engine took its bucket before freeing it (the handle must outlive
    the engine's read)."""

    payloads = False
    checksums: Optional[dict[str, str]] = None

    def __init__(self, client: Any, own: int, tp_size: int):
        self.client, self.own, self.tp_size = client, own, tp_size
        self.device = ipc_device()

    def send_bucket(self, bucket: NamedTensors, dtype: Optional[torch.dtype]) -> None:
        import torch.distributed as dist
        from sglang.srt.utils.common import MultiprocessingSerializer

        flat, entries = flat_bucket(bucket, dtype, self.device, self.checksums)
        serialized = MultiprocessingSerializer.serialize(sglang_flattened_bucket(flat, entries), output_str=True)
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, serialized)
        rank = dist.get_rank()
        error = ""
        if self.own == 0:  # the engine's first rank posts its ranks' entries
            try:
                self.client.update_weights_from_serialized(every[rank:rank + self.tp_size])
            except Exception as exc:  # noqa: BLE001 - told to every rank below, raised on each
                error = f"engine at {self.client.base_url} (trainer rank {rank}): {type(exc).__name__}: {exc}"
        outcomes = [None] * dist.get_world_size()
        dist.all_gather_object(outcomes, error)
        del flat, serialized, every
        failed = [e for e in outcomes if e]
        if failed:
            raise WeightSyncError("update_weights_from_tensor (colocated, every rank's own copy) failed: "
                                  + "; ".join(failed))

    def close(self) -> dict:
        return {}


class DistributedGroup:
    """Rank 0 of a weight-update group (hosted on this process's node address) with every engine's TP
    ranks behind it, joined with SGLang's own rendezvous so real SGLang servers and the CPU server meet it."""

    def __init__(self, clients: Sequence[Any], name: str, tp_size: int, timeout_s: float, host: Optional[str] = None):
        from sglang.srt.utils.common import init_custom_process_group

        self.name = name
        self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")
        host = host or node_address()
        world = 1 + tp_size * len(clients)
        # The store binds port 0 itself: picking a free port and binding it later raced with other sockets
        # (EADDRINUSE in CI). Wrapped in the group-name prefix the engines' tcp:// rendezvous adds on their side.
        self.master = torch.distributed.TCPStore(host, 0, world_size=world, is_master=True, wait_for_workers=False,
                                                 timeout=timedelta(seconds=timeout_s))
        port = self.master.port
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-group")
        joining = pool.submit(on_all_engines, clients, f"init_weights_update_group {name}",
                              lambda i, c: c.init_weights_update_group(host, port, 1 + i * tp_size, world, name,
                                                                       self.backend))
        try:
            self.pg = init_custom_process_group(backend=self.backend, store=torch.distributed.PrefixStore(name, self.master),
                                                timeout=timedelta(seconds=timeout_s), world_size=world, rank=0,
                                                group_name=name)
        except Exception as exc:  # noqa: BLE001 - the engines wait on a store that is gone: never wait for them
            pool.shutdown(wait=False, cancel_futures=True)
            raise WeightSyncError(f"weight-update group {name} at {host}:{port} could not be set up: "
                                  f"{type(exc).__name__}: {exc}") from exc
        try:
            joining.result()
        finally:
            pool.shutdown(wait=False)
        log.info("weight-update group %s: rank 0 at %s:%d + %d engine rank(s) over %s", name, host, port, world - 1,
                 self.backend)

    def broadcast_bucket(self, clients: Sequence[Any], bucket: NamedTensors, dtype: Optional[torch.dtype] = None,
                         checksums: Optional[dict[str, str]] = None) -> None:
        """Announce the bucket to every engine and broadcast it as one flat byte tensor (SGLang's
        `flattened_bucket`) on the backend's device, each tensor converted to `dtype` (None: as it is) as it is
        copied into its slice and popped from `bucket`, never holding
        the converted bucket and its flat copy at once (`flat_bucket`)."""
        flat, entries = flat_bucket(bucket, dtype, self.device, checksums)
        names = [name for name, _, _, _, _ in entries]
        dtypes = [value_dtype for _, _, value_dtype, _, _ in entries]
        shapes = [list(shape) for _, shape, _, _, _ in entries]
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-announce") as pool:
            announced = pool.submit(on_all_engines, clients, f"update_weights_from_distributed ({self.name})",
                                    lambda i, c: c.update_weights_from_distributed(
                                        names, dtypes, shapes, self.name, load_format="flattened_bucket"))
            try:
                torch.distributed.broadcast(flat, src=0, group=self.pg)
            except Exception as exc:  # an engine died mid-broadcast: its announce fails too
                announced.cancel()
                raise WeightSyncError(f"broadcast on {self.name} failed: {exc}") from exc
            announced.result()

    def destroy(self) -> None:
        try:
            torch.distributed.destroy_process_group(self.pg)
        except Exception as exc:  # noqa: BLE001 - best effort
            log.debug("destroy %s: %s", self.name, exc)


class _DistributedWire:
    payloads = False
    checksums: Optional[dict[str, str]] = None

    def __init__(self, target: ServerTarget, key: str):
        self.clients = target.clients()
        memory = _memory(f"{key}|{target.identity}")
        wanted = (tuple(target.urls), target.generation)
        self.group = memory.groups.get(wanted)
        if self.group is None:
            for stale_key, stale in list(memory.groups.items()):  # an engine restarted: the old group is gone
                for c in self.clients:
                    try:
                        c._control("/destroy_weights_update_group", {"group_name": stale.name},
                                   "DestroyWeightsUpdateGroupReqInput")
                    except Exception as exc:  # noqa: BLE001
                        log.debug("destroy_weights_update_group on %s: %s", c.base_url, exc)
                stale.destroy()
                del memory.groups[stale_key]
            # unique for the life of this process (torch never frees a group name): sender, generation, pid, count
            name = f"{GROUP_NAME}_{key}_g{target.generation}_{os.getpid()}_{next(_GROUP_COUNT)}"
            self.group = memory.groups[wanted] = DistributedGroup(self.clients, name, target.tp_size, target.timeout_s)

    def send_bucket(self, bucket: NamedTensors, dtype: Optional[torch.dtype]) -> None:
        self.group.broadcast_bucket(self.clients, bucket, dtype, self.checksums)

    def close(self) -> dict:
        return {}


# -- the driver's side: index of a disk version, a local source for tests and benchmarks ------------
def write_index(directory: Path, weight_map: dict[str, str], total_bytes: int, config_from: Optional[Path]) -> Path:
    """`model.safetensors.index.json` over the senders' files, plus the base checkpoint's config.json (an
    SGLang server loads the directory as a model)."""
    import json
    import shutil

    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f"{INDEX_FILE}.tmp"
    tmp.write_text(json.dumps({"metadata": {"total_size": total_bytes}, "weight_map": dict(sorted(weight_map.items()))},
                              indent=1) + "\n")
    tmp.replace(directory / INDEX_FILE)
    if config_from is not None and (config_from / "config.json").is_file():
        shutil.copyfile(config_from / "config.json", directory / "config.json")
    return directory


class LocalWeightSource:
    """HF-named tensors in this process, pushed like one trainer rank would (tests, benchmarks, tools)."""

    def __init__(self, named: NamedTensors, bucket_bytes: int = 512 << 20, key: str = "local"):
        self.named, self.bucket_bytes, self.key = list(named), bucket_bytes, key

    def buckets(self) -> Any:
        """Buckets of at most `bucket_bytes` (a larger tensor alone), the trainer ranks' rule."""
        bucket, filled = [], 0
        for name, tensor in self.named:
            size = tensor.numel() * tensor.element_size()
            if bucket and filled + size > self.bucket_bytes:
                yield bucket
                bucket, filled = [], 0
            bucket.append((name, tensor))
            filled += size
        if bucket:
            yield bucket

    def push_weights(self, target: Any, version: Any = None, expect_version: Any = None) -> list[dict]:
        named = dict(self.named)
        held = held_weights(target, self.key)
        known = held is not None and held.matches(named)
        sender = target.open(self.key)
        for bucket in self.buckets():
            sender.send(bucket, [(n, held.values[n]) for n, _ in bucket] if known else None)
        stats = sender.close()
        if held is not None:  # what the engines hold now
            held.record(named)
        return [stats]


def merge_stats(parts: Sequence[Optional[dict]]) -> dict:
    """The senders' counts added up (the disk weight maps merged)."""
    out: dict[str, Any] = {"senders": 0, "weight_map": {}}
    for part in parts:
        if not part:
            continue
        out["senders"] += 1
        for k, v in part.items():
            if k in ("weight_map", "checksums"):
                out.setdefault(k, {}).update(v)
            elif k == "seconds" or k.startswith("peak_"):  # the slowest sender; the largest peak
                out[k] = max(out.get(k, 0), v)
            elif isinstance(v, (int, float)):
                out[k] = out.get(k, 0) + v
    return out


def sync_metrics(stats: dict) -> dict[str, float]:
    """A step's metrics row from the merged sender counts."""
    out = {"sync/bytes_sent": float(stats.get("bytes_sent", 0)), "sync/bytes_full": float(stats.get("bytes_full", 0)),
           "sync/senders": float(stats.get("senders", 0)), "time/sync_push": float(stats.get("seconds", 0.0))}
    for key in ("peak_rss_growth", "peak_rss_growth_gather", "peak_rss_growth_send"):  # the largest sender's
        if key in stats:
            out[f"memory/sync_{key.replace('peak_rss_', 'sender_')}_mib"] = stats[key] / 2**20
    if stats.get("elements") and stats.get("delta"):  # what the delta found changed (dense paths send all)
        out["sync/changed_share"] = stats.get("changed", 0) / stats["elements"]
    if stats.get("held_bytes"):  # the senders' copies of what the engines hold (delta), kept between syncs
        out["memory/sync_held_mib"] = stats["held_bytes"] / 2**20
    return out


__all__ = ["sync_metrics", "EmbeddedTarget", "ServerTarget", "Sender", "on_all_engines", "DistributedGroup", "LocalWeightSource", "PeakRSS",
           "WeightSyncError", "write_index", "merge_stats", "node_address", "forget_sender_state", "INDEX_FILE"]
