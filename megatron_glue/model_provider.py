"""Build Megatron-core GPT models that are Qwen3 / Qwen3-MoE, from an HF config.

Qwen3 = GQA attention with per-head RMSNorm on q and k (qk-norm), RMSNorm, SwiGLU MLP, RoPE, no linear
biases; Qwen3-MoE replaces every MLP with a top-k softmax router over SwiGLU experts (top-k
probabilities renormalised when `norm_topk_prob`). The Transformer Engine layer spec is used when TE
imports (GPU); otherwise Megatron-core's local spec, with one substitution for sequence parallelism
(see `SequenceParallelRMSNorm`).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_glue import cpu_compat
from megatron_glue.grouped_experts import GroupedSequentialMLP
from megatron_glue.sdpa_attention import SDPADotProductAttention


def transformer_engine_available() -> bool:
    """TE is used only with CUDA; importing it on a CPU host breaks megatron.core (docs/architecture.md)."""
    if not torch.cuda.is_available():
        return False
    try:
        import transformer_engine.pytorch  # noqa: F401  (probe: does TE load here?)
    except Exception:  # TE raises RuntimeError, not only ImportError, when it cannot load
        return False
    return True


@dataclass(frozen=True)
class ParallelSizes:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    sequence_parallel: bool = False
    etp: Optional[int] = None  # expert tensor-parallel size; None = tp (megatron-core's default)

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @classmethod
    def from_config(cls, parallel: Any) -> "ParallelSizes":
        return cls(
            tp=parallel.tensor_model_parallel_size,
            pp=parallel.pipeline_model_parallel_size,
            ep=parallel.expert_model_parallel_size,
            sequence_parallel=parallel.sequence_parallel,
            etp=parallel.expert_tensor_parallel_size,
        )


class SequenceParallelRMSNorm:
    """torch RMSNorm whose weight is marked `sequence_parallel`.

    Megatron's local-spec norm (`WrappedTorchNorm`) asserts `not config.sequence_parallel`. With sequence
    parallelism each TP rank normalises a slice of the sequence, so the norm weight's grad is partial and
    must be summed across TP ranks; `finalize_model_grads._allreduce_layernorm_grads` does exactly that
    for params carrying `sequence_parallel=True` (as TE's norms set it). Only used without TE.
    """

    def __new__(cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_: Any) -> torch.nn.Module:
        norm = torch.nn.RMSNorm(normalized_shape=hidden_size, eps=eps, dtype=config.params_dtype)
        if config.sequence_parallel:
            for p in norm.parameters():
                p.sequence_parallel = True
        return norm


class QKRMSNorm:
    """torch RMSNorm for the per-head q/k norms, built regardless of `config.sequence_parallel`.

    `WrappedTorchNorm` refuses to build when sequence parallelism is on, but q/k norms act on heads of
    the full (already gathered) sequence; their TP-partial grads are summed by name in
    `finalize_model_grads` ("q_layernorm" / "k_layernorm"), so they must NOT be marked sequence_parallel.
    """

    def __new__(cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_: Any) -> torch.nn.Module:
        return torch.nn.RMSNorm(normalized_shape=hidden_size, eps=eps, dtype=config.params_dtype)


def hf_num_experts(hf_config: Any) -> int:
    """transformers 5 calls it `num_local_experts` (with `num_experts` as an alias in some versions)."""
    return int(getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", 0) or 0)


def hf_is_moe(hf_config: Any) -> bool:
    return hf_num_experts(hf_config) > 0


def rope_theta(hf_config: Any) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def transformer_config_from_hf(
    hf_config: Any,
    parallel: ParallelSizes = ParallelSizes(),
    params_dtype: torch.dtype = torch.float32,
    recompute: str = "none",
    routing_replay: bool = False,
    **overrides: Any,
) -> TransformerConfig:
    """Megatron TransformerConfig equivalent to an HF Qwen3 / Qwen3-MoE config. `routing_replay` gives every
    router a RouterReplay (`moe_enable_routing_replay`, fed by `megatron_glue.routing_replay`)."""
    moe = hf_is_moe(hf_config)
    if routing_replay and not moe:
        raise ValueError("train.routing_replay needs a MoE model; this HF config is dense (no num_experts)")
    if moe and getattr(hf_config, "mlp_only_layers", None):
        raise ValueError("Qwen3-MoE configs with dense mlp_only_layers are not supported")
    if moe and int(getattr(hf_config, "decoder_sparse_step", 1)) != 1:
        raise ValueError("Qwen3-MoE configs with decoder_sparse_step != 1 are not supported")
    if parallel.tp > 1 and moe and not parallel.sequence_parallel:
        raise ValueError("MoE with tensor parallelism needs sequence_parallel=true (megatron-core requirement)")
    bf16 = params_dtype == torch.bfloat16
    kwargs: dict[str, Any] = dict(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads,
        ffn_hidden_size=hf_config.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        qk_layernorm=True,
        add_bias_linear=False,
        add_qkv_bias=False,
        gated_linear_unit=True,
        activation_func=F.silu,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=getattr(hf_config, "initializer_range", 0.02),
        tensor_model_parallel_size=parallel.tp,
        pipeline_model_parallel_size=parallel.pp,
        expert_model_parallel_size=parallel.ep,
        expert_tensor_parallel_size=parallel.expert_tp,
        sequence_parallel=parallel.sequence_parallel,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=bf16,
        use_cpu_initialization=not torch.cuda.is_available(),
        variable_seq_lengths=True,
        # megatron-core accepts variable sequence lengths only with the alltoall dispatcher (checked even
        # for dense models, where the dispatcher is unused).
        moe_token_dispatcher_type="alltoall",
    )
    if moe:
        kwargs.update(
            num_moe_experts=hf_num_experts(hf_config),
            moe_router_topk=hf_config.num_experts_per_tok,
            moe_ffn_hidden_size=hf_config.moe_intermediate_size,
            moe_router_pre_softmax=not getattr(hf_config, "norm_topk_prob", True),
            moe_router_score_function="softmax",
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=float(getattr(hf_config, "router_aux_loss_coef", 0.0)),
            moe_grouped_gemm=False,
            moe_router_dtype="fp32",
            moe_permute_fusion=False,
            moe_enable_routing_replay=bool(routing_replay),
        )
    if recompute == "full":
        kwargs.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif recompute == "selective":
        kwargs.update(recompute_granularity="selective")
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


def _local_block_spec(config: TransformerConfig) -> TransformerBlockSubmodules:
    layer = get_gpt_layer_local_spec(
        num_experts=config.num_moe_experts,
        moe_grouped_gemm=False,
        qk_layernorm=True,
        normalization="RMSNorm",
    )
    layer = copy.deepcopy(layer)
    sub = layer.submodules
    # Hidden-state norms see sequence-parallel slices; q/k norms see full heads (not replaced).
    sub.input_layernorm = SequenceParallelRMSNorm
    sub.pre_mlp_layernorm = SequenceParallelRMSNorm
    attention = sub.self_attention.submodules
    attention.q_layernorm = QKRMSNorm
    attention.k_layernorm = QKRMSNorm
    attention.core_attention = SDPADotProductAttention  # torch's fused kernel for the causal case
    if config.num_moe_experts:
        sub.mlp.submodules.experts.module = GroupedSequentialMLP  # all experts in one grouped matmul
    return TransformerBlockSubmodules(layer_specs=[layer] * config.num_layers, layer_norm=SequenceParallelRMSNorm)


def _te_block_spec(config: TransformerConfig) -> ModuleSpec:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

    return get_gpt_layer_with_transformer_engine_spec(
        num_experts=config.num_moe_experts, moe_grouped_gemm=config.moe_grouped_gemm, qk_layernorm=True
    )


def build_gpt_model(
    hf_config: Any,
    config: TransformerConfig,
    pre_process: bool = True,
    post_process: bool = True,
    use_te: Optional[bool] = None,
) -> GPTModel:
    """A GPTModel for this rank's pipeline stage (parallel state must be initialised)."""
    cpu_compat.apply()
    use_te = transformer_engine_available() if use_te is None else use_te
    spec = _te_block_spec(config) if use_te else _local_block_spec(config)
    if isinstance(spec, TransformerBlockSubmodules):
        from megatron.core.transformer.transformer_block import get_num_layers_to_build

        n_local = get_num_layers_to_build(config)
        spec = dataclasses.replace(spec, layer_specs=spec.layer_specs[:n_local])
    vocab = hf_config.vocab_size
    if vocab % config.tensor_model_parallel_size:
        raise ValueError(
            f"vocab_size {vocab} must be divisible by tensor_model_parallel_size "
            f"{config.tensor_model_parallel_size} (pad the model vocabulary, as Qwen3's 151936 is)"
        )
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=vocab,
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=bool(getattr(hf_config, "tie_word_embeddings", False)),
        position_embedding_type="rope",
        rotary_base=int(rope_theta(hf_config)),
        rotary_percent=1.0,
    )
    return model
