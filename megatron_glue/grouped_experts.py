"""Megatron experts as two grouped matmuls when Transformer Engine is absent (the local layer spec).

megatron-core's local spec runs `SequentialMLP`: a Python loop over the local experts, each a separate
fc1 / activation / fc2 with its own autograd nodes. On an H100 the 2.7B-parameter kit model spent 6x
longer launching those kernels than running them (results/benchmarks/gpu/2026-11-25). `GroupedSequentialMLP`
keeps SequentialMLP's parameters, names and checkpoint layout (so weight conversion, sharding, sync and
resume are unchanged) and computes all experts with `torch.nn.functional.grouped_mm` over the stacked
weights: SwiGLU, the router probability applied after the activation, as `MLP` does. Where grouped_mm cannot
run (expert tensor parallelism, biases, another activation, fp8, dtypes or strides it rejects) it is
SequentialMLP, unchanged. The stacked weights are copies kept for backward: local expert weights once more
per micro-batch in flight (recompute, or Transformer Engine's grouped GEMM, avoids that on large runs).
An expert with a LoRA adapter (megatron_glue/lora.py) enters the stack as its merged weight W + (alpha / r) B A,
which autograd differentiates into the adapter (the frozen W gets no gradient); with adapter dropout the merged
weight is not what the layer computes, so that case runs SequentialMLP.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.transformer.moe.experts import SequentialMLP

from slime_ext.algo.grouped_matmul import grouped_linear, grouped_mm_runs


def _expert_weight(linear: torch.nn.Module) -> torch.Tensor:
    """The weight an expert projection applies: its own, or with a LoRA adapter the merged one."""
    merged = getattr(linear, "merged_weight_shard", None)
    return merged() if merged is not None else linear.weight


def _mergeable(linear: torch.nn.Module) -> bool:
    return not isinstance(getattr(linear, "dropout", None), torch.nn.Dropout)


class GroupedSequentialMLP(SequentialMLP):
    """SequentialMLP's parameters, computed with one grouped matmul per projection."""

    def _grouped_applies(self, hidden: torch.Tensor) -> bool:
        cfg = self.config
        first = self.local_experts[0]
        fc1, fc2 = (getattr(layer, "base", layer) for layer in (first.linear_fc1, first.linear_fc2))
        simple = (self.num_local_experts > 1 and self.tp_group.size() == 1 and cfg.gated_linear_unit
                  and _mergeable(first.linear_fc1) and _mergeable(first.linear_fc2)
                  and cfg.activation_func is F.silu and not cfg.add_bias_linear and not cfg.bias_activation_fusion
                  and getattr(cfg, "activation_func_clamp_value", None) is None
                  and not getattr(cfg, "glu_linear_offset", 0.0) and not cfg.moe_apply_probs_on_input
                  and not (cfg.fp8 or cfg.fp4))
        return simple and grouped_mm_runs(hidden, fc1.weight[None]) \
            and grouped_mm_runs(hidden.new_empty(0, fc2.weight.shape[1]), fc2.weight[None])

    def forward(self, permuted_local_hidden_states: torch.Tensor, tokens_per_expert: torch.Tensor,
                permuted_probs: torch.Tensor):
        hidden = permuted_local_hidden_states
        if not self._grouped_applies(hidden):
            return super().forward(hidden, tokens_per_expert, permuted_probs)
        offsets = torch.as_tensor(tokens_per_expert).to(hidden.device).cumsum(0).to(torch.int32)
        fc1 = torch.stack([_expert_weight(e.linear_fc1) for e in self.local_experts])  # [E, 2 * ffn, hidden]
        fc2 = torch.stack([_expert_weight(e.linear_fc2) for e in self.local_experts])  # [E, hidden, ffn]
        gate, linear = grouped_linear(hidden, fc1, offsets).chunk(2, dim=-1)
        intermediate = F.silu(gate) * linear
        intermediate = (intermediate * permuted_probs.unsqueeze(-1)).to(hidden.dtype)
        return grouped_linear(intermediate, fc2, offsets), None
