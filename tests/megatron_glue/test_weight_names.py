"""megatron_glue.weight_names: HF <-> full Megatron name mapping (logit equivalence with HF, bit-exact round
trips, hand-checked mappings, key and shape errors).

Megatron's parallel state is process-global, so every test that builds a Megatron model uses the
module-scoped `mp` fixture (one process, TP = PP = EP = 1).
"""

from __future__ import annotations

import pytest
import torch

from megatron_glue import sharding as sh
from megatron_glue import weight_names as wn

import transformers  # noqa: E402  (a hard dependency: a missing install must fail, not skip)
from transformers import Qwen3MoeConfig  # noqa: E402

from tests.conversion_fixtures import (  # noqa: E402
    build_megatron,
    canonical,
    dense_cfg,
    hf_model,
    moe_cfg,
    mp,  # noqa: F401  (pytest fixture)
    random_megatron_full,
    tokens,
)

# The project's default policy (configs/models/tiny-qwen3-moe.yaml, vocab from the tokenizer).
TINY_DEFAULT = dict(
    vocab_size=320, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    intermediate_size=512, moe_intermediate_size=256, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
    max_position_embeddings=1024, tie_word_embeddings=False,
)


def megatron_logits(cfg, hf_sd, toks):
    model = build_megatron(cfg)
    shard = sh.shard_megatron_state(wn.hf_to_megatron(hf_sd, cfg), cfg, 0, 1)
    model.load_state_dict(shard, strict=True)
    pos = torch.arange(toks.shape[1])[None].expand(toks.shape[0], -1)
    with torch.no_grad():
        return model(toks, pos, attention_mask=None)


MAX_DIFFS: dict[str, float] = {}


@pytest.mark.parametrize(
    "name,cfg_fn,seq",
    [
        ("moe", lambda: moe_cfg(), 12),
        ("moe_no_norm_topk", lambda: moe_cfg(norm_topk_prob=False), 12),
        ("dense_untied", lambda: dense_cfg(False), 12),
        ("dense_tied", lambda: dense_cfg(True), 12),
        ("tiny_default_moe", lambda: Qwen3MoeConfig(**TINY_DEFAULT), 16),
    ],
)
def test_logit_equivalence_with_hf(mp, name, cfg_fn, seq):
    cfg = cfg_fn()
    model = hf_model(cfg)
    toks = tokens(cfg, seq)
    with torch.no_grad():
        ref = model(toks).logits
    out = megatron_logits(cfg, model.state_dict(), toks)
    assert out.shape == ref.shape == (2, seq, cfg.vocab_size)
    assert ref.std() > 0.3, "degenerate logits would not test anything"
    assert not torch.allclose(ref[0], ref[1], atol=1e-2)
    diff = (out - ref).abs().max().item()
    MAX_DIFFS[name] = diff
    print(f"max |megatron - hf| logits ({name}): {diff:.3g}")
    assert diff < 1e-4


def test_wrong_norm_mapping_would_be_caught(mp):
    """Sanity check of the test itself: swapping the two layer norms changes the logits by >> 1e-4."""
    cfg = moe_cfg()
    model = hf_model(cfg)
    toks = tokens(cfg)
    with torch.no_grad():
        ref = model(toks).logits
    sd = dict(model.state_dict())
    a, b = "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight"
    sd[a], sd[b] = sd[b], sd[a]
    assert (megatron_logits(cfg, sd, toks) - ref).abs().max() > 1e-2


@pytest.mark.parametrize("cfg_fn", [lambda: moe_cfg(), lambda: dense_cfg(False), lambda: dense_cfg(True)])
def test_hf_megatron_hf_bit_exact(cfg_fn):
    cfg = cfg_fn()
    model = hf_model(cfg)
    can = canonical(model, cfg)
    full = dict(wn.hf_to_megatron(can, cfg))
    back = dict(wn.megatron_to_hf(full, cfg))
    assert list(back) == list(can)
    for k in can:
        assert torch.equal(back[k], can[k]), k
    # Fused (in-memory transformers 5) input gives the same Megatron tensors.
    full2 = dict(wn.hf_to_megatron(model.state_dict(), cfg))
    assert list(full2) == list(full) and all(torch.equal(full2[k], full[k]) for k in full)
    # ... and the exported HF weights load back into a transformers model, strictly.
    fresh = type(model)(cfg)
    fresh.load_state_dict(wn.to_transformers_state_dict(back, cfg), strict=True)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k


def test_canonical_names_and_hand_mapping():
    cfg = moe_cfg()
    model = hf_model(cfg)
    sd = model.state_dict()
    can = canonical(model, cfg)
    assert "model.layers.1.mlp.experts.3.gate_proj.weight" in can
    assert not any(k.endswith("gate_up_proj") for k in can)
    I = cfg.moe_intermediate_size
    assert torch.equal(can["model.layers.1.mlp.experts.3.gate_proj.weight"], sd["model.layers.1.mlp.experts.gate_up_proj"][3, :I])
    assert torch.equal(can["model.layers.1.mlp.experts.3.up_proj.weight"], sd["model.layers.1.mlp.experts.gate_up_proj"][3, I:])
    assert torch.equal(can["model.layers.1.mlp.experts.3.down_proj.weight"], sd["model.layers.1.mlp.experts.down_proj"][3])
    full = wn.hf_to_megatron(can, cfg)
    qkv = full["decoder.layers.1.self_attention.linear_qkv.weight"]
    hd, H = cfg.head_dim, cfg.hidden_size
    q, k, v = (can[f"model.layers.1.self_attn.{x}_proj.weight"] for x in "qkv")
    # group 1 = query heads 2, 3 then kv head 1
    g1 = qkv[4 * hd:]
    assert torch.equal(g1[: 2 * hd], q[2 * hd: 4 * hd])
    assert torch.equal(g1[2 * hd: 3 * hd], k[hd: 2 * hd])
    assert torch.equal(g1[3 * hd:], v[hd: 2 * hd])
    fc1 = full["decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight"]
    assert torch.equal(fc1, torch.cat([can["model.layers.0.mlp.experts.2.gate_proj.weight"], can["model.layers.0.mlp.experts.2.up_proj.weight"]]))
    pairs = wn.megatron_param_to_hf("decoder.layers.1.self_attention.linear_qkv.weight", qkv, cfg)
    assert [n for n, _ in pairs] == [f"model.layers.1.self_attn.{x}_proj.weight" for x in "qkv"]
    assert torch.equal(pairs[1][1], k)
    assert H == fc1.shape[1]


@pytest.mark.parametrize("cfg_fn", [lambda: moe_cfg(), lambda: dense_cfg(False), lambda: dense_cfg(True)])
def test_megatron_hf_megatron_bit_exact(cfg_fn):
    cfg = cfg_fn()
    full = random_megatron_full(cfg)
    again = dict(wn.hf_to_megatron(wn.megatron_to_hf(full, cfg), cfg))
    assert list(again) == list(full)
    for k in full:
        assert torch.equal(again[k], full[k]), k


def test_full_state_matches_real_model_keys(mp):
    for cfg in (moe_cfg(), dense_cfg(False), dense_cfg(True)):
        model = build_megatron(cfg)
        real = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
        full = wn.hf_to_megatron(canonical(hf_model(cfg), cfg), cfg)
        assert {k: full.shape_of(k) for k in full} == real


# ------------------------------------------------------------------------------------------------
# Errors


def test_error_missing_tensor():
    cfg = moe_cfg()
    sd = canonical(hf_model(cfg), cfg)
    del sd["model.layers.1.self_attn.k_norm.weight"]
    with pytest.raises(ValueError, match=r"missing 1 tensor\(s\): model\.layers\.1\.self_attn\.k_norm\.weight"):
        wn.hf_to_megatron(sd, cfg)
    full = random_megatron_full(cfg)
    del full["decoder.layers.0.mlp.experts.local_experts.3.linear_fc2.weight"]
    with pytest.raises(ValueError, match=r"decoder\.layers\.0\.mlp\.experts\.local_experts\.3\.linear_fc2\.weight"):
        wn.megatron_to_hf(full, cfg)
    with pytest.raises(ValueError, match=r"local_experts\.3\.linear_fc2"):
        sh.shard_megatron_state(full, cfg, 0, 1)


def test_error_extra_tensor():
    cfg = dense_cfg(False)
    sd = canonical(hf_model(cfg), cfg)
    sd["model.layers.0.mlp.bias_thing.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"unexpected 1 tensor\(s\).*model\.layers\.0\.mlp\.bias_thing\.weight"):
        wn.hf_to_megatron(sd, cfg)
    # A layer beyond num_hidden_layers is extra too.
    sd = canonical(hf_model(cfg), cfg)
    sd["model.layers.2.input_layernorm.weight"] = torch.ones(32)
    with pytest.raises(ValueError, match=r"model\.layers\.2\.input_layernorm\.weight"):
        wn.hf_to_megatron(sd, cfg)
    full = random_megatron_full(cfg)
    full["decoder.layers.0.mlp.router.weight"] = torch.zeros(4, 32)
    with pytest.raises(ValueError, match=r"unexpected.*decoder\.layers\.0\.mlp\.router\.weight"):
        wn.megatron_to_hf(full, cfg)


def test_error_wrong_shape():
    cfg = moe_cfg()
    sd = canonical(hf_model(cfg), cfg)
    sd["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(16, 32)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_proj\.weight: shape \(16, 32\), config expects \(32, 32\)"):
        wn.hf_to_megatron(sd, cfg)
    fused = dict(hf_model(cfg).state_dict())
    fused["model.layers.1.mlp.experts.down_proj"] = torch.zeros(4, 32, 8)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.experts\.down_proj: shape \(4, 32, 8\), config expects \(4, 32, 16\)"):
        wn.hf_to_megatron(fused, cfg)
