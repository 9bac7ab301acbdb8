"""benchmarks/flops.py: a hand count for a tiny config, and torch's FLOP counter on the real HF forward."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM

from benchmarks.flops import forward_flops_per_token, matmul_params_per_token, train_flops_per_token
from tests.megatron_fixtures import tiny_dense_config, tiny_moe_config


def test_hand_count_for_a_tiny_moe():
    cfg = tiny_moe_config()
    h, hd, heads, kv, layers = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers
    per_layer = h * hd * (2 * heads + 2 * kv) + cfg.num_experts_per_tok * 3 * h * cfg.moe_intermediate_size + cfg.num_experts * h
    assert matmul_params_per_token(cfg) == layers * per_layer + cfg.vocab_size * h
    assert forward_flops_per_token(cfg, 10) == 2 * (layers * per_layer + cfg.vocab_size * h) + 4 * layers * heads * hd * 10
    assert train_flops_per_token(cfg, 20) == 3 * forward_flops_per_token(cfg, 10)


def _counted(cfg, seq: int) -> int:
    torch.manual_seed(0)
    cfg._attn_implementation = "eager"  # explicit matmuls (SDPA's CPU kernel has no FLOP formula)
    if hasattr(cfg, "num_experts"):
        cfg._experts_implementation = "eager"  # one linear per routed expert: counts top-k work only
    model = AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(2, cfg.vocab_size, (1, seq))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=ids)
    return counter.get_total_flops()


def test_formula_matches_torchs_flop_counter_on_the_hf_forward():
    seq = 12
    for cfg in (tiny_moe_config(), tiny_dense_config()):
        # eager attention multiplies the full [seq, seq] score matrix (masked afterwards): context = seq
        expected = seq * forward_flops_per_token(cfg, seq)
        assert abs(_counted(cfg, seq) - expected) / expected < 1e-9, type(cfg).__name__
