"""Shared builders for the megatron_glue tests: tiny HF configs and a single-process trainer group."""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen3Config, Qwen3MoeConfig


def tiny_moe_config(vocab_size: int = 64, **kw: Any) -> Qwen3MoeConfig:
    base = dict(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, intermediate_size=64, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=True, router_aux_loss_coef=0.0, max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_theta": 1e6, "rope_type": "default"},
    )
    base.update(kw)
    return Qwen3MoeConfig(**base)


def tiny_tandem_model(seed: int) -> Any:
    """A tiny random MoE causal LM whose logits vary enough (init range 0.5) for tandem samplers to see
    different senior and junior choices; seed 0 and seed 1 make a senior/junior pair."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_moe_config(initializer_range=0.5)).eval()


def tiny_dense_config(vocab_size: int = 64, **kw: Any) -> Qwen3Config:
    base = dict(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, intermediate_size=64, max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_theta": 1e6, "rope_type": "default"},
    )
    base.update(kw)
    return Qwen3Config(**base)


def single_process_parallel_state(seed: int = 0) -> None:
    """A world of one gloo process with TP=PP=EP=DP=1 (idempotent within a pytest process)."""
    from megatron_glue.model_provider import ParallelSizes
    from megatron_glue.parallel import init_distributed, init_model_parallel

    torch.set_num_threads(1)
    init_distributed()
    init_model_parallel(ParallelSizes(), seed=seed)
