"""HF model configs (the source of truth for architecture) from a run config's `model` section."""

from __future__ import annotations

from typing import Any, Optional

from transformers import AutoConfig, Qwen3Config, Qwen3MoeConfig




def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def hf_config_from_model_config(model: Any, tokenizer_vocab: Optional[int] = None) -> Any:
    """An HF Qwen3 / Qwen3-MoE config. With `model.hf_path` the checkpoint's config.json wins; otherwise
    the vocabulary is `model.vocab_size` or the tokenizer's size rounded up to a multiple of 64 (so the
    embedding splits evenly across tensor-parallel ranks, as Qwen3's 151936 does)."""
    if model.hf_path:
        return AutoConfig.from_pretrained(model.hf_path, local_files_only=True)
    vocab = model.vocab_size or (round_up(tokenizer_vocab, 64) if tokenizer_vocab else None)
    if vocab is None:
        raise ValueError("model.vocab_size is not set and no tokenizer size was given")
    common = dict(
        vocab_size=vocab,
        hidden_size=model.hidden_size,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_key_value_heads,
        head_dim=model.head_dim,
        intermediate_size=model.intermediate_size,
        rms_norm_eps=model.rms_norm_eps,
        max_position_embeddings=model.max_position_embeddings,
        tie_word_embeddings=model.tie_word_embeddings,
        rope_parameters={"rope_theta": model.rope_theta, "rope_type": "default"},
    )
    if model.arch == "qwen3":
        return Qwen3Config(**common)
    return Qwen3MoeConfig(
        **common,
        num_experts=model.num_experts,
        num_experts_per_tok=model.num_experts_per_tok,
        moe_intermediate_size=model.moe_intermediate_size,
        norm_topk_prob=True,
        router_aux_loss_coef=model.router_aux_loss_coef,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def parameter_counts(hf_config: Any) -> dict[str, int]:
    """Total and per-token active parameters (embeddings included), for plans and MFU."""
    h, layers, vocab = hf_config.hidden_size, hf_config.num_hidden_layers, hf_config.vocab_size
    hd = getattr(hf_config, "head_dim", None) or h // hf_config.num_attention_heads
    attn = h * hd * (hf_config.num_attention_heads * 2 + hf_config.num_key_value_heads * 2) + 2 * hd
    norms = 2 * h
    experts = int(getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", 0) or 0)
    if experts:
        expert = 3 * h * hf_config.moe_intermediate_size
        mlp_total = experts * expert + experts * h
        mlp_active = hf_config.num_experts_per_tok * expert + experts * h
    else:
        mlp_total = mlp_active = 3 * h * hf_config.intermediate_size
    embed = vocab * h * (1 if hf_config.tie_word_embeddings else 2)
    total = layers * (attn + norms + mlp_total) + embed + h
    active = layers * (attn + norms + mlp_active) + embed + h
    return {"total": total, "active": active}
