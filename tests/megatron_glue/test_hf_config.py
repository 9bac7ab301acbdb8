"""Run-config model sections become the right HF configs; parameter counts match real models."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from megatron_glue.hf_config import hf_config_from_model_config, parameter_counts
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
