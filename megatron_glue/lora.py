"""LoRA adapters on megatron-core's tensor-parallel linear layers: y = W x + (alpha / r) B A x, W frozen.

How the adapter splits under tensor parallelism follows its base layer (a column-parallel layer splits its
output, a row-parallel layer its input):

* column-parallel (q/k/v, fc1): A [r, in] whole on every TP rank, B [out / TP, r] split like W's rows. Without
  sequence parallelism the rank-r activation h = A x is the same on every rank, and its gradient is the sum of
  every rank's B-slice contribution: h passes `copy_to_tensor_model_parallel_region` (identity forward,
  all-reduce backward), so A's gradient and the input's are whole on every rank. With sequence parallelism x
  holds this rank's sequence chunk: h is computed on the chunk and all-gathered (reduce-scattered back), A's
  gradient is then a partial sum over chunks, and A is marked `sequence_parallel` so that megatron-core's
  `finalize_model_grads` all-reduces it across TP as it does the norms.
* row-parallel (attention output, fc2): A [r, in / TP] split like W's columns, B [out, r] whole. The partial
  products A_i x_i are summed across TP (all-reduce; reduce-scatter over the sequence with sequence
  parallelism, B then marked `sequence_parallel`) before B, as the base layer sums its partial outputs.

A is initialised from a generator seeded by `seed` over the whole matrix and each rank keeps its slice, so every
TP layout starts from the same adapter (TP 2 computes what TP 1 does); B starts at zero, so a new adapter leaves
the model's output unchanged.

The routed experts (target `experts`: every expert's fc1 and fc2) are adapted when their expert tensor-parallel
size is 1 (each expert whole on its rank, as in the shipped 30B layout): their adapters are plain
`B A x` with no collective, and like the expert weights they carry `allreduce = False` under expert parallelism,
so megatron-core's DDP reduces their gradients over the expert data-parallel group. Experts split over TP
(expert-TP > 1) would need the dispatcher's explicit communication mirrored in the adapter and are refused.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any, Optional

import torch
from megatron.core import parallel_state as mpu
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.tensor_parallel.mappings import (copy_to_tensor_model_parallel_region,
                                                    gather_from_sequence_parallel_region,
                                                    reduce_from_tensor_model_parallel_region,
                                                    reduce_scatter_to_sequence_parallel_region)


def _init_a(rank: int, in_features: int, seed: int) -> torch.Tensor:
    """The whole A [rank, in] (PEFT's kaiming-uniform with a = sqrt(5): bound 1 / sqrt(in)), from its own
    generator so every TP layout draws the same matrix."""
    gen = torch.Generator().manual_seed(seed)
    bound = 1.0 / math.sqrt(in_features)
    return (torch.rand(rank, in_features, generator=gen) * 2 - 1) * bound


class LoRALinear(torch.nn.Module):
    """A frozen column- or row-parallel linear layer plus a trainable low-rank update; the forward keeps the base
    layer's (output, bias) contract."""

    def __init__(self, base: torch.nn.Module, rank: int, alpha: float, dropout: float = 0.0, seed: int = 0):
        super().__init__()
        if isinstance(base, ColumnParallelLinear):
            self.kind = "column"
        elif isinstance(base, RowParallelLinear):
            self.kind = "row"
        else:
            raise TypeError(f"LoRA wraps megatron-core ColumnParallelLinear / RowParallelLinear, not "
                            f"{type(base).__name__}")
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.rank, self.scaling = rank, alpha / rank
        self.dropout = torch.nn.Dropout(dropout) if dropout > 0 else torch.nn.Identity()
        self.is_expert = bool(getattr(base, "is_expert", False))
        group = getattr(base, "tp_group", None)
        tp = group.size() if group is not None else mpu.get_tensor_model_parallel_world_size()
        tp_rank = group.rank() if group is not None else mpu.get_tensor_model_parallel_rank()
        if self.is_expert and tp > 1:
            raise ValueError(f"train.lora: LoRA on the experts needs expert tensor-parallel size 1 (experts whole on "
                             f"every rank); this model splits them {tp} ways: set the expert TP size to 1 or leave "
                             "'experts' out of train.lora.target_modules")
        self.sequence_parallel = bool(getattr(base, "sequence_parallel", False)) and not self.is_expert
        w = base.weight
        dtype, device = w.dtype, w.device
        if self.kind == "column":
            in_features, out_local = base.input_size, base.output_size_per_partition
            a = _init_a(rank, in_features, seed)
            self.lora_a = torch.nn.Parameter(a.to(device, dtype))
            self.lora_b = torch.nn.Parameter(torch.zeros(out_local, rank, device=device, dtype=dtype))
            if self.sequence_parallel:
                self.lora_a.sequence_parallel = True
        else:
            in_local = base.input_size_per_partition
            a = _init_a(rank, in_local * tp, seed)[:, tp_rank * in_local:(tp_rank + 1) * in_local]
            self.lora_a = torch.nn.Parameter(a.contiguous().to(device, dtype))
            self.lora_b = torch.nn.Parameter(torch.zeros(base.output_size, rank, device=device, dtype=dtype))
            if self.sequence_parallel:
                self.lora_b.sequence_parallel = True
        # which dimension of the full (TP 1) matrix this rank holds a slice of: None = whole
        self.lora_a.tensor_model_parallel = self.kind == "row"
        self.lora_b.tensor_model_parallel = self.kind == "column"
        self.lora_a.partition_dim, self.lora_b.partition_dim = 1, 0
        if self.is_expert:  # as the expert's weight: unique on its expert-TP group of one, reduced as it is
            for p in (self.lora_a, self.lora_b):
                p.tensor_model_parallel = True
                p.allreduce = getattr(w, "allreduce", True)

    def lora_delta(self, x: torch.Tensor) -> torch.Tensor:
        """The adapter's share of the output, shaped as the base layer's output on this rank."""
        h = torch.nn.functional.linear(self.dropout(x), self.lora_a)
        # an expert's adapter is whole on its rank (the dispatcher moves the tokens): no collective
        if self.kind == "column" and not self.is_expert:
            h = gather_from_sequence_parallel_region(h) if self.sequence_parallel else \
                copy_to_tensor_model_parallel_region(h)
        elif not self.is_expert:
            h = reduce_scatter_to_sequence_parallel_region(h) if self.sequence_parallel else \
                reduce_from_tensor_model_parallel_region(h)
        return torch.nn.functional.linear(h, self.lora_b) * self.scaling

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        out, bias = self.base(x, *args, **kwargs)
        return out + self.lora_delta(x).to(out.dtype), bias

    def merged_weight_shard(self) -> torch.Tensor:
        """W + (alpha / r) B A on this rank's shard (what the merged checkpoint and the engines hold)."""
        return self.base.weight + (self.lora_b @ self.lora_a).to(self.base.weight.dtype) * self.scaling


TARGET_MODULES = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")  # attention in / out, dense MLP in / out
EXPERTS = "experts"  # every routed expert's fc1 and fc2


@dataclass(frozen=True)
class LoRASpec:
    """`train.lora` as the trainer takes it: rank 0 is off."""

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = TARGET_MODULES
    sync: str = "merged"  # merged: the engines get the merged model; adapter: the adapters alone (lora_sync.py)


def global_module_name(model: torch.nn.Module, name: str) -> str:
    """`name` with this rank's layer and expert numbers replaced by the model's global ones (a pipeline stage
    counts its layers from 0, an expert-parallel rank its experts), so every layout names a module alike."""
    local = name.split(".")
    parts = list(local)
    for i in range(1, len(local)):
        if not local[i].isdigit():
            continue
        if local[i - 1] == "layers":
            parts[i] = str(model.get_submodule(".".join(local[:i + 1])).layer_number - 1)
        elif local[i - 1] == "local_experts":
            moe_layer = model.get_submodule(".".join(local[:i - 2]))  # <layer>.mlp (.experts.local_experts.<j>)
            parts[i] = str(moe_layer.local_expert_indices[int(local[i])])
    return ".".join(parts)


def apply_lora(model: torch.nn.Module, spec: LoRASpec, seed: int = 0) -> dict[str, LoRALinear]:
    """Wrap every column / row-parallel linear whose name ends in one of `spec.target_modules` (outside the
    routed experts; `experts` adds every expert's fc1 and fc2) in an adapter, freezing every other parameter of
    `model`; returns prefix -> adapter (the prefix as in `model.state_dict()`). Each adapter's A is drawn from
    `seed` and its module's global name, so every parallel layout starts from the same adapters."""
    if spec.rank < 1:
        return {}

    def wanted(name: str) -> bool:
        leaf = name.rsplit(".", 1)[-1]
        if ".experts." in f".{name}.":
            return EXPERTS in spec.target_modules and leaf in ("linear_fc1", "linear_fc2")
        return leaf in spec.target_modules

    targets = [(name, module) for name, module in model.named_modules() if wanted(name)]
    unsupported = sorted({type(m).__name__ for _, m in targets
                          if not isinstance(m, (ColumnParallelLinear, RowParallelLinear))})
    if unsupported:
        raise ValueError(f"train.lora: {unsupported} are not megatron-core's ColumnParallelLinear / RowParallelLinear "
                         "(the Transformer Engine layer spec fuses norms into them): LoRA needs the local layer spec")
    if not targets:
        raise ValueError(f"train.lora.target_modules = {list(spec.target_modules)}: no such linear layer in the "
                         "model (the routed experts are the target 'experts')")
    for p in model.parameters():
        p.requires_grad_(False)
    adapters: dict[str, LoRALinear] = {}
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        position = zlib.crc32(global_module_name(model, name).encode())
        adapter = LoRALinear(module, spec.rank, spec.alpha, spec.dropout, seed=seed * 100_003 + position)
        setattr(parent, child, adapter)
        adapters[name] = adapter
    return adapters


def canonical_state(raw: dict[str, torch.Tensor], adapters: dict[str, LoRALinear]) -> dict[str, torch.Tensor]:
    """The model's state under the names and values of a model without adapters: each adapted layer's weight is
    W + (alpha / r) B A (what the engines, the HF export and the sync hold), its bias and extra state keep their
    names, the adapter's own tensors are left out."""
    if not adapters:
        return raw
    out: dict[str, torch.Tensor] = {}
    for key, value in raw.items():
        prefix, _, leaf = key.rpartition(".")
        if prefix in adapters and leaf in ("lora_a", "lora_b"):
            continue
        owner = prefix[: -len(".base")] if prefix.endswith(".base") else None
        if owner in adapters:
            out[f"{owner}.{leaf}"] = adapters[owner].merged_weight_shard().detach() if leaf == "weight" else value
        else:
            out[key] = value
    return out


def raw_names(state: dict[str, torch.Tensor], adapters: dict[str, LoRALinear]) -> dict[str, torch.Tensor]:
    """Canonical names (a model without adapters) -> the adapted model's: an adapted layer's tensors live under
    `<layer>.base.` (its weights load into the frozen base; the adapters keep what they hold)."""
    if not adapters:
        return state
    out = {}
    for key, value in state.items():
        prefix, _, leaf = key.rpartition(".")
        out[f"{prefix}.base.{leaf}" if prefix in adapters else key] = value
    return out


__all__ = ["EXPERTS", "LoRALinear", "LoRASpec", "TARGET_MODULES", "apply_lora", "canonical_state", "global_module_name",
           "raw_names"]
