"""Run megatron-core 0.16 on machines without CUDA: the one place that adapts it.

`apply()` is a no-op when CUDA is available, so nothing here reaches a GPU run, except
`fix_missing_te_general_gemm()`, a megatron-core 0.16.1 bug fix that every host without Transformer
Engine needs (GPU included).

How: megatron-core calls `torch.cuda.*` and creates tensors with `device='cuda'` at many call sites.
Rather than patching `torch` for the whole process, we give each affected megatron-core module its own
`torch` proxy (`_CpuTorch`): identical to torch except that `torch.cuda` is a CPU stand-in
(`_CpuCuda`: current device = cpu, streams and events are no-ops, RNG state = the CPU generator) and
factory functions map `device='cuda'` to the CPU. The table `_PROXIED_MODULES` names every module
that gets the proxy and the call sites it answers. Everything outside megatron-core sees real torch.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import warnings
from typing import Any, Iterable

import torch

log = logging.getLogger(__name__)
_APPLIED = False

# module -> the call sites (megatron-core 0.16.1) that need a CPU answer.
_PROXIED_MODULES: dict[str, str] = {
    "megatron.core.tensor_parallel.layers": "torch.cuda.current_device() in weight init and the "
    "sequence-parallel all-gather buffers of ColumnParallelLinear / RowParallelLinear",
    "megatron.core.tensor_parallel.mappings": "torch.cuda.current_device() for gather / reduce-scatter "
    "output buffers (_gather_along_first_dim, _reduce_scatter_along_first_dim, all-to-all)",
    "megatron.core.tensor_parallel.random": "torch.cuda.get_rng_state / manual_seed in "
    "CudaRNGStatesTracker.add and fork (model_parallel_cuda_manual_seed)",
    "megatron.core.tensor_parallel.cross_entropy": "device buffers of vocab-parallel cross entropy",
    "megatron.core.models.common.embeddings.rotary_pos_embedding": "RotaryEmbedding moves inv_freq to "
    "torch.cuda.current_device() and builds position ranges there",
    "megatron.core.models.gpt.gpt_model": "torch.cuda.current_device() for MTP / loss buffers",
    "megatron.core.transformer.attention": "torch.cuda.current_device() for the inference KV buffers",
    "megatron.core.transformer.dot_product_attention": "torch.cuda.current_device() for the causal mask",
    "megatron.core.transformer.transformer_layer": "torch.cuda.current_device() in layer helpers",
    "megatron.core.transformer.moe.router": "router weights moved to torch.cuda.current_device(); "
    "aux-loss buffers created there",
    "megatron.core.transformer.moe.experts": "expert weight init on torch.cuda.current_device()",
    "megatron.core.transformer.moe.token_dispatcher": "MoEAlltoAllTokenDispatcher creates "
    "torch.cuda.Stream() and switches streams for the device-to-host copy of split sizes",
    "megatron.core.transformer.moe.moe_utils": "torch.zeros(..., device='cuda') in the MoE aux-loss "
    "tracker; record_stream on torch.cuda.current_stream()",
    "megatron.core.optimizer.optimizer": "found_inf / scale tensors with device='cuda'",
    "megatron.core.optimizer.distrib_optimizer": "shard buffers on torch.cuda.current_device()",
    "megatron.core.optimizer.clip_grads": "grad-norm tensors with device='cuda' "
    "(get_grad_norm_fp32, clip_grad_by_total_norm_fp32, count_zeros_fp32)",
    "megatron.core.distributed.param_and_grad_buffer": "grad buffers on torch.cuda.current_device(); "
    "communication streams",
    "megatron.core.distributed.distributed_data_parallel": "torch.cuda.Stream for the overlapped "
    "grad-reduce communication stream",
    "megatron.core.distributed.finalize_model_grads": "device buffers for the all-reduce of "
    "sequence-parallel / embedding grads",
    "megatron.core.utils": "GlobalMemoryBuffer.get_tensor allocates on torch.cuda.current_device() "
    "(the attention matmul buffer of DotProductAttention)",
    "megatron.core.transformer.utils": "get_default_causal_mask builds torch.ones(..., device='cuda') "
    "(the causal mask of the unfused softmax)",
    "megatron.core.pipeline_parallel.schedules": "torch.cuda.current_device() for the loss "
    "reduction tensors of the pipeline schedules",
    "megatron.core.pipeline_parallel.p2p_communication": "receive buffers on "
    "torch.cuda.current_device() for pipeline send/recv",
}

_FACTORIES = (
    "tensor", "zeros", "ones", "empty", "full", "arange", "rand", "randn", "randint",
    "zeros_like", "ones_like", "empty_like", "full_like", "as_tensor",
)


def _cpu_device(device: Any) -> Any:
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    if isinstance(device, str) and device.startswith("cuda"):
        return "cpu"
    if isinstance(device, int) and not isinstance(device, bool):
        return "cpu"
    return device


class _NullStream:
    """Stands in for torch.cuda.Stream / Event: CPU ops are synchronous, so waiting is a no-op."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, *args: Any) -> None:
        pass

    def wait_event(self, *args: Any) -> None:
        pass

    def record_event(self, *args: Any) -> "_NullStream":
        return _NullStream()

    def record(self, *args: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _NullStream)

    def __hash__(self) -> int:
        return 0


class _CpuRandom:
    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)


class _CpuCuda:
    """`torch.cuda` as megatron-core sees it on a CPU host."""

    random = _CpuRandom
    Stream = _NullStream
    Event = _NullStream
    get_rng_state = staticmethod(_CpuRandom.get_rng_state)
    set_rng_state = staticmethod(_CpuRandom.set_rng_state)

    @staticmethod
    def current_device() -> torch.device:
        return torch.device("cpu")

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.random.default_generator.manual_seed(int(seed))

    @staticmethod
    def current_stream(*args: Any) -> _NullStream:
        return _NullStream()

    default_stream = current_stream

    @staticmethod
    def stream(*args: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    @staticmethod
    def synchronize(*args: Any) -> None:
        pass

    @staticmethod
    def empty_cache() -> None:
        pass

    @staticmethod
    def memory_allocated(*args: Any) -> int:
        return 0

    max_memory_allocated = memory_allocated

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


def _as_int_list(sizes: Any) -> Any:
    return sizes.tolist() if hasattr(sizes, "tolist") else sizes


class _CpuDistributed:
    """`torch.distributed` for megatron-core on CPU: gloo's all_to_all_single accepts split sizes only
    as Python lists, while the MoE all-to-all (`mappings._AllToAll.forward`, called by
    MoEAlltoAllTokenDispatcher with EP > 1) passes arrays."""

    @staticmethod
    def all_to_all_single(output: torch.Tensor, input: torch.Tensor, output_split_sizes: Any = None,
                          input_split_sizes: Any = None, group: Any = None, async_op: bool = False) -> Any:
        return torch.distributed.all_to_all_single(
            output, input, output_split_sizes=_as_int_list(output_split_sizes),
            input_split_sizes=_as_int_list(input_split_sizes), group=group, async_op=async_op,
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.distributed, name)


def _move_to_host(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    """`moe_utils.maybe_move_tensor_to_cpu` converts only CUDA tensors, so on CPU the dispatcher's
    split sizes stay tensors (on GPU they become numpy arrays and `sum()` of them a plain integer used in
    buffer shapes). Mirror the GPU result."""
    if as_numpy and isinstance(tensor, torch.Tensor):
        return tensor.numpy()
    return tensor


class _CpuTorch:
    """`torch` as seen by one megatron-core module on a CPU host."""

    cuda = _CpuCuda()
    distributed = _CpuDistributed()

    def __getattr__(self, name: str) -> Any:
        value = getattr(torch, name)
        if name in _FACTORIES:
            def factory(*args: Any, _fn=value, **kwargs: Any) -> Any:
                if "device" in kwargs:
                    kwargs["device"] = _cpu_device(kwargs["device"])
                return _fn(*args, **kwargs)

            return factory
        return value


def fix_missing_te_general_gemm() -> None:
    """megatron-core 0.16.1: `moe_utils` references `te_general_gemm` even when Transformer Engine is
    absent (NameError in the MoE router's gating linear, on GPU too). Define it as None so the router
    takes its plain `torch.mm` branch; harmless when TE is present (the name then exists)."""
    moe_utils = importlib.import_module("megatron.core.transformer.moe.moe_utils")
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _set_cpu_rng_state(new_state: torch.Tensor, device: Any = -1, graph_safe: bool = False) -> None:
    torch.set_rng_state(new_state)


def _get_cpu_rng_state(device: Any = "cuda", clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    return torch.get_rng_state()


def _clip_grads_via_decoupled(original: Any) -> Any:
    """clip_grads.clip_grad_by_total_norm_fp32 asserts `param.grad.type() == 'torch.cuda.FloatTensor'`
    before scaling grads in place. Its `use_decoupled_grad` branch does the same scaling but checks only
    the dtype, so on CPU we route the grads through that branch (same tensors, scaled in place)."""

    def clip(parameters: Any, max_norm: float, total_norm: float, use_decoupled_grad: bool = False) -> None:
        if use_decoupled_grad:
            return original(parameters, max_norm, total_norm, use_decoupled_grad=True)
        params = list(parameters) if not isinstance(parameters, torch.Tensor) else [parameters]
        aliased = [p for p in params if p.grad is not None]
        for p in aliased:
            p.decoupled_grad = p.grad
        try:
            original(aliased, max_norm, total_norm, use_decoupled_grad=True)
        finally:
            for p in aliased:
                del p.decoupled_grad

    return clip


def cuda_typed(params: Iterable[torch.nn.Parameter]) -> None:
    """Megatron's optimizers sort params by `param.type()` and accept only 'torch.cuda.*Tensor'
    (DistributedOptimizer._build_model_and_main_param_groups, Float16OptimizerWithFloat16Params).
    On CPU, answer that query with the CUDA name for these parameters only."""
    if torch.cuda.is_available():
        return
    original = torch.Tensor.type
    for p in params:
        def typed(*args: Any, _p=p, **kwargs: Any) -> Any:
            if args or kwargs:
                return original(_p, *args, **kwargs)
            return original(_p).replace("torch.", "torch.cuda.", 1)

        p.type = typed


def apply() -> bool:
    """Adapt megatron-core to a CPU host. Returns True if adaptations were applied (idempotent)."""
    global _APPLIED
    fix_missing_te_general_gemm()
    if torch.cuda.is_available():
        return False
    if _APPLIED:
        return True
    proxy = _CpuTorch()
    for name in _PROXIED_MODULES:
        module = importlib.import_module(name)
        module.torch = proxy
    rng = importlib.import_module("megatron.core.tensor_parallel.random")
    # CudaRNGStatesTracker.fork / checkpointing restore states through these two helpers, which index
    # torch.cuda.default_generators (tensor_parallel/random.py).
    rng._set_cuda_rng_state = _set_cpu_rng_state
    rng._get_cuda_rng_state = _get_cpu_rng_state
    dispatcher = importlib.import_module("megatron.core.transformer.moe.token_dispatcher")
    dispatcher.maybe_move_tensor_to_cpu = _move_to_host
    optimizer = importlib.import_module("megatron.core.optimizer.optimizer")
    optimizer.clip_grad_by_total_norm_fp32 = _clip_grads_via_decoupled(optimizer.clip_grad_by_total_norm_fp32)
    # CudaRNGStatesTracker.fork warns when the CPU RNG moved inside a "GPU" RNG context; on CPU the two
    # are the same generator, so that is expected.
    warnings.filterwarnings("ignore", message="CPU RNG state changed within GPU RNG context")
    _APPLIED = True
    log.info("megatron-core CPU compatibility applied to %d modules", len(_PROXIED_MODULES))
    return True
