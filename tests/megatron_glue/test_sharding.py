"""megatron_glue.sharding: TP / EP / PP rank shards of full Megatron states (bit-exact shard / gather, hand-checked
slices, real stage and parallel models, Transformer Engine names, size errors).

Megatron's parallel state is process-global, so every test that builds a Megatron model uses the
module-scoped `mp` fixture (one process, TP = PP = EP = 1).
"""

from __future__ import annotations

import copy

import pytest
import torch

from megatron_glue import sharding as sh
from megatron_glue import weight_names as wn

import transformers  # noqa: E402  (a hard dependency: a missing install must fail, not skip)

from tests.conversion_fixtures import (  # noqa: E402
    all_shards,
    build_megatron,
    canonical,
    dense_cfg,
    hf_model,
    moe_cfg,
    mp,  # noqa: F401  (pytest fixture)
    random_megatron_full,
    tokens,
)

MAX_DIFFS: dict[str, float] = {}

SHARDINGS = [(2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 2)]


@pytest.mark.parametrize("sizes", SHARDINGS)
@pytest.mark.parametrize("kind", ["moe", "dense_untied", "dense_tied"])
def test_shard_gather_bit_exact(kind, sizes):
    tp, ep, pp = sizes
    cfg = {"moe": moe_cfg, "dense_untied": lambda: dense_cfg(False), "dense_tied": lambda: dense_cfg(True)}[kind]()
    full = random_megatron_full(cfg)
    if kind != "moe" and ep > 1:
        with pytest.raises(ValueError, match="ep 2 > 1 needs a MoE model"):
            sh.shard_megatron_state(full, cfg, 0, tp, 0, ep, 0, pp)
        return
    shards = all_shards(full, cfg, tp, ep, pp)
    for sd in shards.values():
        for v in sd.values():
            if v is not None:  # no views onto the full tensors
                assert v.untyped_storage().nbytes() == v.numel() * v.element_size()
    gathered = sh.gather_megatron_states(shards, cfg, tp, ep, pp)
    assert list(gathered) == list(full)
    for k in full:
        assert torch.equal(gathered[k], full[k]), k


def test_expert_tp_1_keeps_experts_whole_and_round_trips():
    """slime's layout: TP splits attention and dense parts, experts stay whole on every TP rank."""
    cfg = moe_cfg()
    full = random_megatron_full(cfg)
    shards = {(t, e, 0): sh.shard_megatron_state(full, cfg, t, 2, e, 2, 0, 1, etp_size=1)
              for t in range(2) for e in range(2)}
    fc1 = "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight"
    for t in range(2):  # tp ranks 0 and 1 of ep rank 1 hold the same whole expert 3
        assert torch.equal(shards[t, 1, 0][fc1], full["decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight"])
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    assert shards[0, 0, 0][qkv].shape[0] * 2 == full[qkv].shape[0]  # attention still TP-split
    gathered = sh.gather_megatron_states(shards, cfg, 2, 2, 1, etp_size=1)
    assert all(torch.equal(gathered[k], full[k]) for k in full)
    with pytest.raises(ValueError, match="expert tensor-parallel size 3 is not supported"):
        sh.shard_megatron_state(full, cfg, 0, 2, 0, 2, 0, 1, etp_size=3)
    with pytest.raises(ValueError, match="shard \\(tp=0, ep=0, pp=0\\)"):  # TP-split experts are not ETP-1 shards
        sh.gather_megatron_states(all_shards(full, cfg, 2, 2, 1), cfg, 2, 2, 1, etp_size=1)


def test_shard_slices_by_hand():
    """(tp, ep, pp) = (2, 2, 2): the slices a rank gets, checked against the HF tensors directly."""
    cfg = moe_cfg()
    can = canonical(hf_model(cfg), cfg)
    full = wn.hf_to_megatron(can, cfg)
    sd = sh.shard_megatron_state(full, cfg, tp_rank=1, tp_size=2, ep_rank=1, ep_size=2, pp_rank=1, pp_size=2)
    I, hd, H, V = cfg.moe_intermediate_size, cfg.head_dim, cfg.hidden_size, cfg.vocab_size
    # pp stage 1 holds global layer 1 as local layer 0; ep rank 1 holds global experts 2, 3 as local 0, 1.
    hl = "model.layers.1."
    ml = "decoder.layers.0."
    assert not any(k.startswith("decoder.layers.1.") for k in sd)
    assert "embedding.word_embeddings.weight" not in sd
    assert sorted({k.split(".")[6] for k in sd if ".local_experts." in k}) == ["0", "1"]
    fc1 = sd[ml + "mlp.experts.local_experts.0.linear_fc1.weight"]
    assert fc1.shape == (I, H)  # (2I / tp, H)
    assert torch.equal(fc1[: I // 2], can[hl + "mlp.experts.2.gate_proj.weight"][I // 2:])
    assert torch.equal(fc1[I // 2:], can[hl + "mlp.experts.2.up_proj.weight"][I // 2:])
    fc2 = sd[ml + "mlp.experts.local_experts.1.linear_fc2.weight"]
    assert torch.equal(fc2, can[hl + "mlp.experts.3.down_proj.weight"][:, I // 2:])
    qkv = sd[ml + "self_attention.linear_qkv.weight"]  # tp rank 1 = query group 1: q heads 2, 3; kv head 1
    assert qkv.shape == (4 * hd, H)
    assert torch.equal(qkv[: 2 * hd], can[hl + "self_attn.q_proj.weight"][2 * hd:])
    assert torch.equal(qkv[2 * hd: 3 * hd], can[hl + "self_attn.k_proj.weight"][hd:])
    assert torch.equal(qkv[3 * hd:], can[hl + "self_attn.v_proj.weight"][hd:])
    assert torch.equal(sd[ml + "self_attention.linear_proj.weight"], can[hl + "self_attn.o_proj.weight"][:, 2 * hd:])
    assert torch.equal(sd[ml + "mlp.router.weight"], can[hl + "mlp.gate.weight"])
    assert torch.equal(sd[ml + "pre_mlp_layernorm.weight"], can[hl + "post_attention_layernorm.weight"])
    assert torch.equal(sd[ml + "self_attention.k_layernorm.weight"], can[hl + "self_attn.k_norm.weight"])
    assert torch.equal(sd["output_layer.weight"], can["lm_head.weight"][V // 2:])
    assert torch.equal(sd["decoder.final_layernorm.weight"], can["model.norm.weight"])
    assert sd[ml + "self_attention.linear_qkv._extra_state"] is None
    first = sh.shard_megatron_state(full, cfg, 1, 2, 0, 2, 0, 2)
    assert torch.equal(first["embedding.word_embeddings.weight"], can["model.embed_tokens.weight"][V // 2:])
    assert "output_layer.weight" not in first and "decoder.final_layernorm.weight" not in first
    # Dense gated fc1 on tp rank 1: gate rows [I/2:I] then up rows [I/2:I].
    dcfg = dense_cfg(True)
    dcan = canonical(hf_model(dcfg), dcfg)
    dsd = sh.shard_megatron_state(wn.hf_to_megatron(dcan, dcfg), dcfg, 1, 2, 0, 1, 1, 2)
    Id = dcfg.intermediate_size
    dfc1 = dsd["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(dfc1, torch.cat([dcan["model.layers.1.mlp.gate_proj.weight"][Id // 2:], dcan["model.layers.1.mlp.up_proj.weight"][Id // 2:]]))
    # Tied and pp > 1: the last stage has the output layer, a copy of its embedding shard.
    assert torch.equal(dsd["output_layer.weight"], dcan["model.embed_tokens.weight"][V // 2:])


@pytest.mark.parametrize("kind", ["moe", "dense_untied", "dense_tied"])
def test_stage_shards_match_real_stage_models(mp, kind):
    """pp = 2 (tp = ep = 1): each stage's shard loads strictly into a model built as that stage
    (half the layers, pre_process / post_process as for the stage) and has its exact keys and shapes."""
    cfg = {"moe": moe_cfg, "dense_untied": lambda: dense_cfg(False), "dense_tied": lambda: dense_cfg(True)}[kind]()
    full = random_megatron_full(cfg)
    stage_cfg = copy.deepcopy(cfg)
    stage_cfg.num_hidden_layers = cfg.num_hidden_layers // 2
    for stage in (0, 1):
        model = build_megatron(stage_cfg, pre_process=stage == 0, post_process=stage == 1)
        real = {k: (None if v is None else tuple(v.shape)) for k, v in model.state_dict().items()}
        shard = sh.shard_megatron_state(full, cfg, 0, 1, 0, 1, stage, 2)
        assert {k: (None if v is None else tuple(v.shape)) for k, v in shard.items()} == real
        model.load_state_dict(shard, strict=True)
        sh.load_into_model(model, sh.shard_megatron_state(full, cfg, 0, 1, 0, 1, stage, 2, extra_state=False))
    if kind == "dense_tied":
        assert "output_layer.weight" in real  # the last stage of a tied model owns an output layer


def test_tp_shard_shapes():
    cfg = moe_cfg()
    full = random_megatron_full(cfg)
    real = {k: full[k].shape for k in full}
    sd = sh.shard_megatron_state(full, cfg, 0, 2, 0, 2, 0, 1)
    assert sd["embedding.word_embeddings.weight"].shape == (32, 32)
    assert sd["decoder.layers.1.self_attention.linear_qkv.weight"].shape == (real["decoder.layers.1.self_attention.linear_qkv.weight"][0] // 2, 32)
    assert sd["decoder.layers.1.self_attention.linear_proj.weight"].shape == (32, 16)
    assert sd["decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight"].shape == (16, 32)
    assert sd["decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight"].shape == (32, 8)
    assert "decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight" not in sd
    assert sd["decoder.layers.1.mlp.router.weight"].shape == (4, 32)


def test_load_into_model_adapts_te_names():
    """A model with Transformer Engine's names (norms fused into the next linear, extra state)."""

    class Lin(torch.nn.Module):
        def __init__(self, norm: bool):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(4, 4))
            if norm:
                self.layer_norm_weight = torch.nn.Parameter(torch.zeros(4))

        def get_extra_state(self):
            return torch.tensor([7])

        def set_extra_state(self, state):
            self.extra = state

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear_qkv = Lin(True)

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear_fc1 = Lin(True)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attention, self.mlp = Attn(), Mlp()

    m = torch.nn.Module()
    m.layer = Layer()
    shard = {
        "layer.input_layernorm.weight": torch.full((4,), 2.0),
        "layer.pre_mlp_layernorm.weight": torch.full((4,), 3.0),
        "layer.self_attention.linear_qkv.weight": torch.ones(4, 4),
        "layer.self_attention.linear_qkv._extra_state": None,
        "layer.mlp.linear_fc1.weight": torch.ones(4, 4),
    }
    sh.load_into_model(m, shard)
    assert torch.equal(m.layer.self_attention.linear_qkv.layer_norm_weight, torch.full((4,), 2.0))
    assert torch.equal(m.layer.mlp.linear_fc1.layer_norm_weight, torch.full((4,), 3.0))
    assert m.layer.self_attention.linear_qkv.extra is None and torch.equal(m.layer.mlp.linear_fc1.extra, torch.tensor([7]))
    # ... and such names gather back to local-spec names.
    cfg = dense_cfg(False)
    full = random_megatron_full(cfg)
    te = {}
    for k, v in sh.shard_megatron_state(full, cfg, 0, 1).items():
        k = k.replace(".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight")
        te[k.replace(".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight")] = v
    assert "decoder.layers.1.mlp.linear_fc1.layer_norm_weight" in te
    gathered = sh.gather_megatron_states({(0, 0, 0): te}, cfg, 1)
    assert all(torch.equal(gathered[k], full[k]) for k in full)


# ------------------------------------------------------------------------------------------------
# Errors


def test_error_parallel_sizes():
    cfg = moe_cfg()  # 2 kv heads, 4 experts, 2 layers
    full = random_megatron_full(cfg)
    with pytest.raises(ValueError, match="num_key_value_heads 2 is not divisible by tp 4"):
        sh.shard_megatron_state(full, cfg, 0, 4)
    with pytest.raises(ValueError, match="num_experts 4 is not divisible by ep 3"):
        sh.shard_megatron_state(full, cfg, 0, 1, 0, 3)
    with pytest.raises(ValueError, match="num_hidden_layers 2 is not divisible by pp 4"):
        sh.check_parallel_sizes(cfg, 1, 1, 4)
    with pytest.raises(ValueError, match="tp_rank 2 out of range"):
        sh.shard_megatron_state(full, cfg, 2, 2)


def test_error_gather_and_tied():
    cfg = moe_cfg()
    full = random_megatron_full(cfg)
    shards = all_shards(full, cfg, 2, 1, 1)
    with pytest.raises(ValueError, match=r"missing shards for \(tp, ep, pp\) ranks \[\(1, 0, 0\)\]"):
        sh.gather_megatron_states({(0, 0, 0): shards[0, 0, 0]}, cfg, 2, 1, 1)
    bad = dict(shards[1, 0, 0])
    bad["decoder.layers.0.self_attention.linear_proj.weight"] = torch.zeros(32, 32)
    with pytest.raises(ValueError, match=r"shard \(tp=1, ep=0, pp=0\).*linear_proj\.weight: shape \(32, 32\), config expects \(32, 16\)"):
        sh.gather_megatron_states({**shards, (1, 0, 0): bad}, cfg, 2, 1, 1)
    dcfg = dense_cfg(True)
    sd = canonical(hf_model(dcfg), dcfg)
    sd["lm_head.weight"] = torch.zeros_like(sd["model.embed_tokens.weight"])
    with pytest.raises(ValueError, match="lm_head.weight differs"):
        wn.hf_to_megatron(sd, dcfg)


# ------------------------------------------------------------------------------------------------
# Real tensor- / expert-parallel models (2 processes, gloo): the shards load strictly and give HF's logits.


def _parallel_worker(rank, kind, tp, ep):
    import torch.distributed as dist
    from megatron.core import parallel_state as mps

    from megatron_glue.model_provider import ParallelSizes, build_gpt_model, transformer_config_from_hf
    from megatron_glue.parallel import init_model_parallel

    sizes = ParallelSizes(tp=tp, ep=ep, sequence_parallel=tp > 1)
    init_model_parallel(sizes)
    cfg = moe_cfg() if kind == "moe" else dense_cfg(True)
    hf = hf_model(cfg)
    toks = tokens(cfg, seq=12, seed=1 + mps.get_data_parallel_rank())
    tc = transformer_config_from_hf(cfg, sizes)
    model = build_gpt_model(cfg, tc).eval()
    ranks = (mps.get_tensor_model_parallel_rank(), mps.get_expert_model_parallel_rank())
    shard = sh.shard_megatron_state(wn.hf_to_megatron(hf.state_dict(), cfg), cfg, ranks[0], tp, ranks[1], ep)
    model.load_state_dict(shard, strict=True)
    pos = torch.arange(toks.shape[1])[None].expand(toks.shape[0], -1)
    with torch.no_grad():
        out = model(toks, pos, attention_mask=None)
        if tp > 1:  # vocab-parallel logits
            parts = [torch.empty_like(out) for _ in range(tp)]
            dist.all_gather(parts, out.contiguous(), group=mps.get_tensor_model_parallel_group())
            out = torch.cat(parts, -1)
        ref = hf(toks).logits
    return {"ranks": ranks, "diff": (out - ref).abs().max().item(), "shape": list(out.shape)}


@pytest.mark.parametrize("kind,tp,ep", [("moe", 2, 1), ("moe", 1, 2), ("dense_tied", 2, 1)])
def test_real_parallel_models_match_hf(kind, tp, ep):
    from tests.distributed import run_ranks

    results = run_ranks(_parallel_worker, 2, kind, tp, ep)
    assert sorted(tuple(r["ranks"]) for r in results) == ([(0, 0), (1, 0)] if tp == 2 else [(0, 0), (0, 1)])
    for r in results:
        assert r["shape"] == [2, 12, 64]
        MAX_DIFFS[f"{kind}_tp{tp}_ep{ep}"] = max(MAX_DIFFS.get(f"{kind}_tp{tp}_ep{ep}", 0.0), r["diff"])
        print(f"max |megatron - hf| logits ({kind}, tp={tp}, ep={ep}, ranks={r['ranks']}): {r['diff']:.3g}")
        assert r["diff"] < 1e-4
