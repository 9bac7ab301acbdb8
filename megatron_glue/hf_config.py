"""HF model configs (the source of truth for architecture) from a run config's `model` section."""

from __future__ import annotations

from typing import Any, Optional

from transformers import AutoConfig, Qwen3Config, Qwen3MoeConfig

# model.* keys and the HF config attributes they stand for: the one map the builder below writes a config
# from and the driver (`slime_ext.orchestration.driver.checkpoint_model_fields`) reads a checkpoint back with.
HF_MODEL_KEYS = {
    "arch": "model_type", "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_key_value_heads", "head_dim": "head_dim",
    "intermediate_size": "intermediate_size", "num_experts": "num_experts", "num_experts_per_tok": "num_experts_per_tok",
    "moe_intermediate_size": "moe_intermediate_size", "rope_theta": "rope_theta", "rms_norm_eps": "rms_norm_eps",
    "max_position_embeddings": "max_position_embeddings", "tie_word_embeddings": "tie_word_embeddings",
    "router_aux_loss_coef": "router_aux_loss_coef",
}
# Keys the builder does not copy attribute for attribute: `arch` picks the config class (model_type), the
# vocabulary may come from the tokenizer, and transformers 5 keeps rope_theta in `rope_parameters`.
DERIVED_KEYS = ("arch", "vocab_size", "rope_theta")
# Keys only a Qwen3-MoE config has.
MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "router_aux_loss_coef")


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
    common = {attr: getattr(model, key) for key, attr in HF_MODEL_KEYS.items()
              if key not in DERIVED_KEYS and key not in MOE_KEYS}
    common.update(vocab_size=vocab, rope_parameters={"rope_theta": model.rope_theta, "rope_type": "default"})
    if model.arch == "qwen3":
        return Qwen3Config(**common)
    moe = {HF_MODEL_KEYS[key]: getattr(model, key) for key in MOE_KEYS}
    return Qwen3MoeConfig(**common, **moe, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])


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
