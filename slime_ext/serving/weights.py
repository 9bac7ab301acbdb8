"""Weight updates of a running server, done the way an SGLang 0.5.21 engine server does them.

Three transports, one apply step:
- disk: every `*.safetensors` of a directory (HF names, as `megatron_glue.checkpoint_io.save_hf_checkpoint`
  writes them);
- tensor: a `MultiprocessingSerializer` payload (base64 of a ForkingPickler pickle of `[(name, tensor)]`,
  or of a flattened bucket), unpickled with an allow-list like SGLang's `SafeUnpickler`. CPU tensors cross
  unrelated processes only as shared-memory file names: the sender must call
  `torch.multiprocessing.set_sharing_strategy("file_system")` before serialising;
- distributed: tensors broadcast from rank 0 of a process group joined with SGLang's own rendezvous
  (`init_custom_process_group`: `tcp://` store hosted by rank 0, `PrefixStore(group_name)`), so a trainer
  that drives real SGLang servers drives this one with the same calls; no default process group needed.

Apply: every name and shape is checked against the served model before anything is copied (a bad tensor
leaves the old weights and version in place), running requests are aborted if asked, then the batcher's
exclusive section waits for the running `generate` call, copies, sets the version and lets generation go
on. Tensor and distributed updates need an open weight-update session (`begin_weight_update`), as in
SGLang 0.5.21. Every method blocks: routes run them off the event loop.
"""

from __future__ import annotations

import io
import logging
import pickle
import threading
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from sglang_patches import weight_payload

log = logging.getLogger(__name__)

NamedTensors = list[tuple[str, torch.Tensor]]
SESSION_OPS = ("update_weights_from_tensor", "update_weights_from_distributed")
FILE_SYSTEM_HINT = ("the sender must call torch.multiprocessing.set_sharing_strategy('file_system') before "
                    "serialising CPU tensors (file descriptors and CUDA IPC handles cannot reach this server)")


class WeightUpdateError(Exception):
    """A refused or failed update: the route answers 400 `{"success": false, "message": str(exc)}`."""


# -- MultiprocessingSerializer.deserialize without importing sglang ------------------------------
@dataclass
class FlattenedTensorMetadata:
    """Stand-in for sglang.srt.weight_sync.tensor_bucket.FlattenedTensorMetadata (same fields)."""

    name: str
    shape: Any
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int


def _safe_load_torch_storage(data: bytes) -> Any:
    storage = torch.load(io.BytesIO(data), weights_only=True)
    if not isinstance(storage, (torch.storage.TypedStorage, torch.UntypedStorage)):
        raise pickle.UnpicklingError(f"expected a torch storage, got {type(storage).__name__}")
    return storage


_DTYPES = ("bfloat16", "bool", "double", "float", "float16", "float32", "float64", "half", "int", "int8", "int16",
           "int32", "int64", "long", "short", "uint8", "uint16", "uint32", "uint64", "complex64", "complex128",
           "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
_STORAGES = ("BFloat16", "Bool", "Byte", "Char", "ComplexDouble", "ComplexFloat", "Double", "Float", "Half", "Int",
             "Long", "Short")


class SafeUnpickler(pickle.Unpickler):
    """SGLang's SafeUnpickler allow-list (Python containers, torch data types and the CPU rebuild functions
    of torch.multiprocessing), with a clear refusal for what a CPU server in another process cannot
    rebuild: CUDA/NPU IPC handles and file descriptors."""

    ALLOWED = frozenset({
        *(("builtins", n) for n in ("bool", "bytearray", "bytes", "complex", "dict", "float", "frozenset", "int",
                                    "list", "range", "set", "slice", "str", "tuple")),
        ("collections", "OrderedDict"), ("collections", "defaultdict"), ("collections", "deque"),
        ("collections", "Counter"), ("copyreg", "__newobj__"), ("copyreg", "__newobj_ex__"),
        ("types", "SimpleNamespace"), ("_codecs", "encode"),
        ("torch", "Tensor"), ("torch", "Size"), ("torch", "device"), ("torch", "dtype"),
        ("torch.nn.parameter", "Parameter"), ("torch.serialization", "_get_layout"),
        *(("torch", d) for d in _DTYPES),
        *(("torch", f"{s}Tensor") for s in _STORAGES if s not in ("ComplexDouble", "ComplexFloat")),
        *(("torch", f"{s}Storage") for s in _STORAGES),
        ("torch", "UntypedStorage"), ("torch.storage", "UntypedStorage"), ("torch.storage", "_UntypedStorage"),
        ("torch.storage", "TypedStorage"),
        *(("torch._utils", n) for n in ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3",
                                        "_rebuild_parameter", "_rebuild_parameter_with_state",
                                        "_rebuild_meta_tensor_no_storage", "_rebuild_wrapper_subclass",
                                        "_rebuild_device_tensor_from_numpy", "_rebuild_device_tensor_from_cpu_tensor")),
        ("torch._tensor", "_rebuild_from_type_v2"),
        *(("torch.multiprocessing.reductions", n) for n in ("rebuild_tensor", "rebuild_meta_tensor",
                                                            "rebuild_storage_filename", "rebuild_storage_empty",
                                                            "rebuild_typed_storage", "rebuild_typed_storage_child",
                                                            "rebuild_nested_tensor", "rebuild_sparse_coo_tensor",
                                                            "rebuild_sparse_compressed_tensor")),
    })
    REFUSED = {
        ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"): "a CUDA tensor",
        ("sglang.srt.utils.patch_torch", "_rebuild_cuda_tensor_modified"): "a CUDA tensor",
        ("torch_npu.multiprocessing.reductions", "rebuild_npu_tensor"): "an NPU tensor",
        ("torch.multiprocessing.reductions", "rebuild_storage_fd"): "a storage shared by file descriptor",
        ("multiprocessing.resource_sharer", "DupFd"): "a file descriptor",
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch.storage", "_load_from_bytes"):
            return _safe_load_torch_storage  # torch's own helper would run an unrestricted torch.load
        if (module, name) == ("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata"):
            return FlattenedTensorMetadata
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        if (module, name) in self.REFUSED:
            raise WeightUpdateError(f"the payload holds {self.REFUSED[module, name]} ({module}.{name}), which this "
                                    f"CPU server cannot rebuild: {FILE_SYSTEM_HINT}")
        raise WeightUpdateError(f"blocked unsafe global ({module}.{name}) during pickle deserialization")


def deserialize(data: bytes) -> Any:
    """`MultiprocessingSerializer.deserialize` of raw (already base64-decoded) bytes."""
    try:
        return SafeUnpickler(io.BytesIO(data)).load()
    except WeightUpdateError:
        raise
    except Exception as exc:  # noqa: BLE001 - a truncated pickle, a vanished shared-memory file, ...
        hint = f"; {FILE_SYSTEM_HINT}" if isinstance(exc, (OSError, RuntimeError)) else ""
        raise WeightUpdateError(f"cannot deserialize the named tensors: {type(exc).__name__}: {exc}{hint}") from None


def named_tensors_from(obj: Any, load_format: Optional[str]) -> NamedTensors:
    """The `[(name, tensor)]` list a deserialized payload stands for (a flattened bucket is unpacked)."""
    if load_format == "flattened_bucket":
        if not isinstance(obj, dict) or not isinstance(obj.get("flattened_tensor"), torch.Tensor) \
                or not isinstance(obj.get("metadata"), list):
            raise WeightUpdateError("load_format 'flattened_bucket' needs {'flattened_tensor': tensor, "
                                    "'metadata': [...]}")
        flat = obj["flattened_tensor"]
        out = []
        for meta in obj["metadata"]:
            if not isinstance(meta, FlattenedTensorMetadata):
                raise WeightUpdateError("flattened bucket metadata must be FlattenedTensorMetadata objects")
            out.append((meta.name, flat[meta.start_idx:meta.end_idx].view(meta.dtype).reshape(meta.shape)))
        return out
    if not isinstance(obj, (list, tuple)) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], torch.Tensor)
            for p in obj):
        raise WeightUpdateError("the serialized payload must be a list of (name, tensor) pairs")
    return [(name, tensor) for name, tensor in obj]


def safetensors_files(model_path: str) -> list[Path]:
    root = Path(model_path)
    if not root.is_dir():
        raise WeightUpdateError(f"model_path {model_path!r} is not a directory this server can read")
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise WeightUpdateError(f"model_path {model_path!r} has no *.safetensors files")
    return files


def safetensors_headers(files: Sequence[Path]) -> NamedTensors:
    """Names and shapes of every tensor (meta tensors: the headers only, no data read)."""
    from safetensors import safe_open

    named: NamedTensors = []
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as handle:
                for key in handle.keys():
                    named.append((key, torch.empty(handle.get_slice(key).get_shape(), device="meta")))
        except Exception as exc:  # noqa: BLE001 - unreadable or corrupt shard
            raise WeightUpdateError(f"cannot read {f}: {type(exc).__name__}: {exc}") from None
    return named


def read_safetensors_file(path: Path) -> NamedTensors:
    from safetensors.torch import load_file

    try:
        return list(load_file(str(path)).items())
    except Exception as exc:  # noqa: BLE001 - a shard that changed or broke after the header check
        raise WeightUpdateError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None


def read_safetensors(model_path: str) -> NamedTensors:
    """Every tensor of the directory's safetensors files (small checkpoints, tests)."""
    return [pair for f in safetensors_files(model_path) for pair in read_safetensors_file(f)]


# -- SGLang's custom process group (sglang.srt.utils.common.init_custom_process_group) -----------
def tcp_url(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host and not host.startswith("[") else f"tcp://{host}:{port}"


def init_custom_process_group(backend: str, init_method: str, world_size: int, rank: int, group_name: str,
                              timeout: Optional[timedelta] = None) -> Any:
    """A process group that is not the default group, set up exactly as SGLang does (same store keys), so
    a trainer using SGLang's function at rank 0 meets this server at rank `rank`."""
    from torch.distributed.distributed_c10d import (Backend, PrefixStore, _new_process_group_helper, _world,
                                                    default_pg_timeout, rendezvous)

    timeout = timeout or default_pg_timeout
    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    pg, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), store, group_name=group_name,
                                      backend_options=None, timeout=timeout)
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def parse_dtype(name: Any) -> torch.dtype:
    dtype = getattr(torch, str(name).removeprefix("torch."), None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise WeightUpdateError(f"unknown dtype {name!r} (use torch dtype names such as 'float32', 'bfloat16')")
    return dtype


@dataclass
class _Group:
    pg: Any
    device: torch.device
    rank: int
    world_size: int


# -- the updater ---------------------------------------------------------------------------------
class WeightUpdater:
    """Weight-update state of one server: the session flag, the update groups and the apply step."""

    def __init__(self, state: Any):
        self.state = state
        self.session_open = False
        self.groups: dict[str, _Group] = {}
        self._lock = threading.Lock()  # session flag and group table
        self.updates = 0
        self.checker: Any = None  # /weights_checker state (its snapshot), made on first use

    # -- sessions (SGLang 0.5.21 SchedulerWeightUpdaterManager) -----------------------------------
    def begin(self) -> str:
        with self._lock:
            if self.session_open:
                raise WeightUpdateError("a weight-update session is already open; call end_weight_update() first")
            self.session_open = True
        return "Success"

    def end(self) -> str:
        with self._lock:
            if not self.session_open:
                raise WeightUpdateError("no weight-update session is open; call begin_weight_update() first")
            self.session_open = False
        return "Success"

    def _need_session(self, op: str) -> None:
        if not self.session_open:
            raise WeightUpdateError(f"{op} must run between begin_weight_update() and end_weight_update()")

    # -- checking and applying --------------------------------------------------------------------
    def _model(self) -> Any:
        engine = self.state.engine
        model = getattr(engine, "model", None)
        if not isinstance(model, torch.nn.Module) or not hasattr(engine, "update_weights_from_tensor"):
            raise WeightUpdateError(f"this server's engine ({type(engine).__name__}) has no weights to update")
        return model

    def check(self, named: NamedTensors) -> None:
        """Every name resolves to a parameter (per-expert names into the fused experts) of the right shape."""
        self._model()
        if not named:
            raise WeightUpdateError("the update holds no tensors")
        check = getattr(self.state.engine, "check_weight_update", None)
        if check is None:  # an engine without the check validates inside its own update
            return
        try:
            check(named)
        except KeyError:
            bad = next(n for n, _ in named if not self._resolves(n))
            raise WeightUpdateError(f"weight update: {bad!r} matches no parameter of the served model") from None
        except ValueError as exc:
            raise WeightUpdateError(str(exc).replace("model expects", "the served model expects")) from None

    def _resolves(self, name: str) -> bool:
        try:
            self.state.engine.parameter(name)
            return True
        except KeyError:
            return False

    def apply(self, named: NamedTensors, weight_version: Optional[str], abort_all: bool) -> None:
        """Check everything, then copy with no generate call running; sets the version when given."""
        self.check(named)
        self._exclusive_update(lambda: self.state.engine.update_weights_from_tensor(named), weight_version, abort_all)

    def _exclusive_update(self, write: Callable[[], None], weight_version: Optional[str], abort_all: bool) -> None:
        """Abort running requests if asked, then `write()` (already checked) with no generate call running,
        then the version."""
        batcher = self.state.batcher
        if abort_all:
            batcher.abort_all()
        with batcher.exclusive():
            try:
                write()
            except WeightUpdateError:
                raise
            except Exception as exc:  # noqa: BLE001 - checked before: should not happen
                raise WeightUpdateError(f"Failed to update parameter online: {exc}. The weights may be partially "
                                        f"updated; discard them and load a full set.") from None
            if weight_version is not None:
                batcher.set_weight_version(str(weight_version))
            self.updates += 1

    @staticmethod
    def _versioned(message: str, weight_version: Optional[str]) -> str:
        return message if weight_version is None else f"{message} Weight version updated to {weight_version}."

    # -- transports -------------------------------------------------------------------------------
    def from_disk(self, model_path: str, load_format: Optional[str], weight_version: Optional[str],
                  abort_all: bool) -> str:
        if load_format not in (None, "auto", "safetensors"):
            raise WeightUpdateError(f"load_format {load_format!r} is not supported: this server reads HF "
                                    f"*.safetensors (load_format null, 'auto' or 'safetensors')")
        self._model()
        files = safetensors_files(model_path)
        self.check(safetensors_headers(files))  # every name and shape first: a bad directory changes nothing

        def write_file_by_file() -> None:  # this server holds one shard beyond its weights, not the model
            for f in files:
                self.state.engine.update_weights_from_tensor(read_safetensors_file(f))

        self._exclusive_update(write_file_by_file, weight_version, abort_all)
        self.state.model_path = self.state.model_name = str(model_path)  # as SGLang's tokenizer manager
        return self._versioned("Succeeded to update model weights.", weight_version)

    def from_tensor(self, payloads: Sequence[bytes], load_format: Optional[str], weight_version: Optional[str],
                    abort_all: bool) -> str:
        self._need_session("update_weights_from_tensor")
        if load_format not in (None, "direct", "flattened_bucket", weight_payload.LOADER):
            raise WeightUpdateError(f"Unknown load_format={load_format} (this server takes null, 'direct', "
                                    f"'flattened_bucket' or the custom loader {weight_payload.LOADER!r})")
        if not payloads:
            raise WeightUpdateError("serialized_named_tensors is empty: send one serialized payload per TP rank")
        named = named_tensors_from(deserialize(payloads[0]), load_format)  # TP rank 0's (this server has one)
        if load_format == weight_payload.LOADER:
            self.apply_payload(named, weight_version, abort_all)
        else:
            self.apply(named, weight_version, abort_all)
        return "Success"

    def load_lora(self, name: str, config: dict, payloads: Sequence[bytes], load_format: Optional[str]) -> str:
        """SGLang's /load_lora_adapter_from_tensors: TP rank 0's copy, merged into the weights with no generate
        call running (slime_ext/engine/lora_merge.py); requests then name the adapter (lora_path)."""
        engine = self.state.engine
        if not hasattr(engine, "load_lora_adapter"):
            raise WeightUpdateError(f"this server's engine ({type(engine).__name__}) does not serve LoRA adapters")
        if not payloads:
            raise WeightUpdateError("serialized_named_tensors is empty: send one serialized payload per TP rank")
        if load_format not in (None, "direct"):
            raise WeightUpdateError(f"Unknown load_format={load_format} for a LoRA adapter (this server takes null)")
        named = named_tensors_from(deserialize(payloads[0]), None)
        # the engine checks names, pairs, ranks and shapes before it writes anything
        self._exclusive_update(lambda: self._lora_call(engine.load_lora_adapter, name, config, named), None, False)
        return f"Success: LoRA adapter {name!r} loaded."

    def unload_lora(self, name: str) -> str:
        engine = self.state.engine
        if not hasattr(engine, "unload_lora_adapter"):
            raise WeightUpdateError(f"this server's engine ({type(engine).__name__}) does not serve LoRA adapters")
        self._exclusive_update(lambda: self._lora_call(engine.unload_lora_adapter, name), None, False)
        return f"Success: LoRA adapter {name!r} unloaded."

    @staticmethod
    def _lora_call(fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except (KeyError, ValueError) as exc:
            raise WeightUpdateError(str(exc).strip("'\"")) from None

    def apply_payload(self, payload: NamedTensors, weight_version: Optional[str], abort_all: bool) -> None:
        """A checksummed (possibly sparse) bucket of `sglang_patches.weight_payload`, applied as SGLang's
        custom weight loader would: checked first, then written and verified with no generate running. A
        checksum that fails is a WeightUpdateError: the trainer stops the run."""
        self._model()
        engine = self.state.engine
        try:
            weight_payload.check_payload(payload, engine.parameter)
        except (KeyError, ValueError) as exc:
            raise WeightUpdateError(str(exc).strip("'\"")) from None

        def write_and_verify() -> None:
            try:
                weight_payload.apply_payload(payload, engine.parameter)
            except weight_payload.ChecksumMismatch as exc:
                raise WeightUpdateError(str(exc)) from None
            finally:
                getattr(engine, "flush_cache", lambda: None)()

        self._exclusive_update(write_and_verify, weight_version, abort_all)

    def init_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                   group_name: str, backend: str) -> str:
        if backend == "nccl" and not torch.cuda.is_available():
            raise WeightUpdateError("backend 'nccl' needs CUDA, which this server does not have; use backend 'gloo'")
        if backend not in ("gloo", "nccl"):
            raise WeightUpdateError(f"backend {backend!r} is not supported (gloo, or nccl with CUDA)")
        if not group_name:
            raise WeightUpdateError("Group name cannot be empty")
        if not 0 < rank_offset < world_size:
            raise WeightUpdateError(f"rank_offset {rank_offset} must lie in [1, world_size={world_size}): rank 0 "
                                    f"is the trainer that broadcasts")
        with self._lock:
            if group_name in self.groups:
                raise WeightUpdateError(f"a weight update group {group_name!r} exists already; destroy it first")
        log.info("joining weight update group %s at %s:%s as rank %d of %d (%s)", group_name, master_address,
                 master_port, rank_offset, world_size, backend)
        try:
            pg = init_custom_process_group(backend, tcp_url(master_address, master_port), world_size, rank_offset,
                                           group_name)
        except Exception as exc:  # noqa: BLE001 - rendezvous timeouts, refused connections, name clashes
            raise WeightUpdateError(f"Failed to initialize custom process group: {exc}.") from None
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        with self._lock:
            self.groups[group_name] = _Group(pg, device, rank_offset, world_size)
        return "Succeeded to initialize custom process group."

    def destroy_group(self, group_name: str) -> str:
        with self._lock:
            group = self.groups.pop(group_name, None)
        if group is None:
            raise WeightUpdateError("The group to be destroyed does not exist.")
        try:
            torch.distributed.destroy_process_group(group.pg)
        except Exception as exc:  # noqa: BLE001
            raise WeightUpdateError(f"Failed to destroy custom process group: {exc}.") from None
        return "Succeeded to destroy custom process group."

    def from_distributed(self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
                         group_name: str, load_format: Optional[str], weight_version: Optional[str],
                         abort_all: bool) -> str:
        """Receive `names` by broadcast from rank 0 in order (one flat uint8 broadcast for
        load_format 'flattened_bucket'), then apply. Once the group and the specs check out, everything
        is received even if applying then fails, so the trainer's broadcasts never hang."""
        self._need_session("update_weights_from_distributed")
        group = self.groups.get(group_name)
        if group is None:
            raise WeightUpdateError(f"Group {group_name} not in {sorted(self.groups)}. Please call "
                                    f"`init_weights_update_group` first.")
        if not len(names) == len(dtypes) == len(shapes):
            raise WeightUpdateError(f"names, dtypes and shapes differ in length ({len(names)}, {len(dtypes)}, "
                                    f"{len(shapes)})")
        if load_format not in (None, "flattened_bucket"):
            raise WeightUpdateError(f"load_format {load_format!r} is not supported for distributed updates "
                                    f"(null or 'flattened_bucket')")
        torch_dtypes = [parse_dtype(d) for d in dtypes]
        if any(int(s) < 0 for shape in shapes for s in shape):
            raise WeightUpdateError("shapes must not have negative sizes")
        named = self._receive(group, list(names), torch_dtypes, [list(map(int, s)) for s in shapes],
                              load_format == "flattened_bucket")
        self.apply(named, weight_version, abort_all)
        return "Succeeded to update parameter online."

    @staticmethod
    def _receive(group: _Group, names: list[str], dtypes: list[torch.dtype], shapes: list[list[int]],
                 flattened: bool) -> NamedTensors:
        try:
            if flattened:
                sizes = [torch.Size(s).numel() * torch.empty((), dtype=d).element_size()
                         for s, d in zip(shapes, dtypes)]
                flat = torch.empty(sum(sizes), dtype=torch.uint8, device=group.device)
                torch.distributed.broadcast(flat, src=0, group=group.pg)
                out, start = [], 0
                for name, dtype, shape, size in zip(names, dtypes, shapes, sizes):
                    out.append((name, flat[start:start + size].view(dtype).reshape(shape)))
                    start += size
                return out
            tensors = [torch.empty(s, dtype=d, device=group.device) for s, d in zip(shapes, dtypes)]
            handles = [torch.distributed.broadcast(t, src=0, group=group.pg, async_op=True) for t in tensors]
            for h in handles:
                h.wait()
            return list(zip(names, tensors))
        except Exception as exc:  # noqa: BLE001
            raise WeightUpdateError(f"Failed to receive weights: {exc}") from None

    def get(self, name: str, truncate_size: int) -> list:
        """SGLang's get_weights_by_name: the first `truncate_size` rows of a parameter, as float32 lists."""
        self._model()
        with self.state.batcher.exclusive():
            try:
                value = self.state.engine.parameter(name)
            except KeyError:
                raise WeightUpdateError(f"Get parameter by name failed: {name!r} matches no parameter") from None
            return value.detach().cpu().to(torch.float32).tolist()[:truncate_size]

    # -- versions and memory ----------------------------------------------------------------------
    def set_version(self, version: str, abort_all: bool) -> None:
        batcher = self.state.batcher
        if abort_all:
            batcher.abort_all()
        with batcher.exclusive():
            batcher.set_weight_version(str(version))

    def check_weights(self, action: str, skip: Optional[list[str]]) -> Optional[dict]:
        """SGLang's `/weights_checker` actions on the served model, with no generate call running."""
        from slime_ext.serving.weight_checker import WeightChecker

        self._model()
        if self.checker is None:
            self.checker = WeightChecker(lambda: self.state.engine.model)
        with self.state.batcher.exclusive():
            result = self.checker.handle(action, skip)
            if action == "reset_tensors":
                getattr(self.state.engine, "flush_cache", lambda: None)()  # its KV came from the old weights
            return result

    def memory(self, action: str, tags: Optional[list[str]]) -> None:
        """`release_memory_occupation` / `resume_memory_occupation` of the engine, with no generate running."""
        method = getattr(self.state.engine, f"{action}_memory_occupation", None)
        if method is None:
            return
        with self.state.batcher.exclusive():
            try:
                method(tags)
            except ValueError as exc:  # unknown tags
                raise WeightUpdateError(str(exc)) from None
