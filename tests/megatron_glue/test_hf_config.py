"""Run-config model sections become the right HF configs; parameter counts match real models."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from megatron_glue.hf_config import HF_MODEL_KEYS, hf_config_from_model_config, parameter_counts
from slime_ext.config import load_config
from tests.conftest import CONFIGS


def test_tiny_default_builds_and_counts_match_the_instantiated_model():
    cfg = load_config(CONFIGS / "grpo.yaml").config
    hf = hf_config_from_model_config(cfg.model, tokenizer_vocab=320)
    assert hf.vocab_size == 320 and hf.model_type == "qwen3_moe"
    model = AutoModelForCausalLM.from_config(hf)
    n = sum(p.numel() for p in model.parameters())
    assert parameter_counts(hf)["total"] == n
    assert 3.0e6 < n < 4.0e6  # "a few million parameters" (DESIGN: ~3.4M)
    dense = hf_config_from_model_config(load_config(CONFIGS / "grpo.yaml", []).config.model.model_copy(
        update={"arch": "qwen3", "tie_word_embeddings": True}), tokenizer_vocab=300)
    assert dense.vocab_size == 320  # rounded up to a multiple of 64
    assert parameter_counts(dense)["total"] == sum(p.numel() for p in AutoModelForCausalLM.from_config(dense).parameters())


def test_qwen3_30b_a3b_config_has_the_published_size():
    cfg = load_config(CONFIGS / "grpo.yaml").config
    big = load_config(CONFIGS / "models" / "qwen3-30b-a3b.yaml").config.model
    counts = parameter_counts(hf_config_from_model_config(big))
    assert counts["total"] == pytest.approx(30.5e9, rel=0.01)  # "30.5B total"
    assert counts["active"] == pytest.approx(3.3e9, rel=0.02)  # "3.3B activated"
    assert cfg.model.name == "tiny-qwen3-moe"


def test_missing_vocab_is_an_error():
    cfg = load_config(CONFIGS / "grpo.yaml").config
    with pytest.raises(ValueError, match="vocab_size is not set"):
        hf_config_from_model_config(cfg.model)


# The HF config fields each shipped model section stands for, written out by hand from configs/models/*.yaml
# (the schema's defaults where the YAML is silent: rope_theta 1e6, rms_norm_eps 1e-6, router_aux_loss_coef
# 0.001; the vocabulary from `tokenizer.vocab_size` 512, already a multiple of 64, where no model.vocab_size).
ROPE = {"rope_theta": 1_000_000.0, "rope_type": "default"}
COMMON_TINY = dict(vocab_size=512, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=32, intermediate_size=512, rms_norm_eps=1e-6, max_position_embeddings=1024,
                   rope_parameters=ROPE)
MOE_CONSTANTS = dict(norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
EXPECTED_HF = {
    "tiny-qwen3-moe": dict(COMMON_TINY, model_type="qwen3_moe", tie_word_embeddings=False, num_local_experts=8,
                           num_experts_per_tok=2, moe_intermediate_size=256, router_aux_loss_coef=0.001,
                           **MOE_CONSTANTS),
    "tiny-qwen3": dict(COMMON_TINY, model_type="qwen3", tie_word_embeddings=True),
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, intermediate_size=6144,
                          num_local_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                          rope_parameters=ROPE, rms_norm_eps=1e-6, max_position_embeddings=40960,
                          tie_word_embeddings=False, router_aux_loss_coef=0.001, **MOE_CONSTANTS),
    # the OPD launcher's teacher (HF Qwen/Qwen3-32B config.json)
    "qwen3-32b": dict(model_type="qwen3", vocab_size=151936, hidden_size=5120, num_hidden_layers=64,
                      num_attention_heads=64, num_key_value_heads=8, head_dim=128, intermediate_size=25600,
                      rope_parameters=ROPE, rms_norm_eps=1e-6, max_position_embeddings=40960,
                      tie_word_embeddings=False),
}
# configs whose tokenizer section sets another vocabulary (already a multiple of 64), by hand
TOKENIZER_VOCAB = {"grpo_v2.yaml": 640}
MOE_ONLY = ("num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "router_aux_loss_coef",
            *MOE_CONSTANTS)
SHIPPED = sorted(CONFIGS.glob("*.yaml")) + sorted((CONFIGS / "models").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_shipped_model_section_builds_the_hand_listed_hf_config(path):
    """The builder writes its fields from HF_MODEL_KEYS; this pins what it writes for every shipped config."""
    cfg = load_config(path).config
    built = hf_config_from_model_config(cfg.model, tokenizer_vocab=cfg.tokenizer.vocab_size).to_dict()
    expected = dict(EXPECTED_HF[cfg.model.name])
    if path.name in TOKENIZER_VOCAB:
        expected["vocab_size"] = TOKENIZER_VOCAB[path.name]
    assert {k: built.get(k) for k in expected} == expected
    if expected["model_type"] == "qwen3":
        assert not set(MOE_ONLY) & set(built)


def test_hf_model_keys_cover_the_model_section():
    """Every architecture field of the model section has its HF attribute (name and hf_path are not architecture)."""
    from slime_ext.config.sections import ModelConfig

    assert set(HF_MODEL_KEYS) == set(ModelConfig.model_fields) - {"name", "hf_path"}
