"""megatron_glue.convert: HF <-> Megatron weight mapping, sharding, checkpoint directories, CLI.

Megatron's parallel state is process-global, so every test that builds a Megatron model uses the
module-scoped `mp` fixture (one process, TP = PP = EP = 1).
"""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch

from megatron_glue import convert as cv

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: E402

torch.set_num_threads(1)

MOE_SMALL = dict(
    vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    intermediate_size=64, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
    rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, max_position_embeddings=256,
)
DENSE_SMALL = dict(
    vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    intermediate_size=48, rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, max_position_embeddings=256,
)
# The project's default policy (configs/models/tiny-qwen3-moe.yaml, vocab from the tokenizer).
TINY_DEFAULT = dict(
    vocab_size=320, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    intermediate_size=512, moe_intermediate_size=256, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
    max_position_embeddings=1024, tie_word_embeddings=False,
)


def moe_cfg(**kw):
    return Qwen3MoeConfig(**{**MOE_SMALL, **kw})


def dense_cfg(tied: bool, **kw):
    return Qwen3Config(**{**DENSE_SMALL, "tie_word_embeddings": tied, **kw})


def hf_model(cfg, seed: int = 0):
    """An HF model with O(1)-scale random weights; norm weights perturbed away from 1."""
    torch.manual_seed(seed)
    cls = Qwen3MoeForCausalLM if isinstance(cfg, Qwen3MoeConfig) else Qwen3ForCausalLM
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, p.shape[-1] ** -0.5)
    return model


def tokens(cfg, seq: int = 12, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, cfg.vocab_size, (2, seq), generator=g)
    assert not torch.equal(t[0], t[1])
    return t


def canonical(model, cfg):
    return dict(cv.canonical_hf_state_dict(model.state_dict(), cfg))


@pytest.fixture(scope="module")
def mp():
    from megatron_glue.parallel import init_distributed, init_model_parallel, teardown
    from megatron_glue.model_provider import ParallelSizes

    init_distributed()
    init_model_parallel(ParallelSizes())
    yield
    teardown()


def build_megatron(cfg, pre_process=True, post_process=True):
    from megatron_glue.model_provider import ParallelSizes, build_gpt_model, transformer_config_from_hf

    tc = transformer_config_from_hf(cfg, ParallelSizes())
    return build_gpt_model(cfg, tc, pre_process=pre_process, post_process=post_process).eval()


def megatron_logits(cfg, hf_sd, toks):
    model = build_megatron(cfg)
    shard = cv.shard_megatron_state(cv.hf_to_megatron(hf_sd, cfg), cfg, 0, 1)
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
    full = dict(cv.hf_to_megatron(can, cfg))
    back = dict(cv.megatron_to_hf(full, cfg))
    assert list(back) == list(can)
    for k in can:
        assert torch.equal(back[k], can[k]), k
    # Fused (in-memory transformers 5) input gives the same Megatron tensors.
    full2 = dict(cv.hf_to_megatron(model.state_dict(), cfg))
    assert list(full2) == list(full) and all(torch.equal(full2[k], full[k]) for k in full)
    # ... and the exported HF weights load back into a transformers model, strictly.
    fresh = type(model)(cfg)
    fresh.load_state_dict(cv.to_transformers_state_dict(back, cfg), strict=True)
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
    full = cv.hf_to_megatron(can, cfg)
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
    pairs = cv.megatron_param_to_hf("decoder.layers.1.self_attention.linear_qkv.weight", qkv, cfg)
    assert [n for n, _ in pairs] == [f"model.layers.1.self_attn.{x}_proj.weight" for x in "qkv"]
    assert torch.equal(pairs[1][1], k)
    assert H == fc1.shape[1]


def random_megatron_full(cfg, seed=3):
    g = torch.Generator().manual_seed(seed)
    ref = cv.hf_to_megatron(canonical(hf_model(cfg), cfg), cfg)
    return {k: torch.randn(ref.shape_of(k), generator=g) for k in ref}


@pytest.mark.parametrize("cfg_fn", [lambda: moe_cfg(), lambda: dense_cfg(False), lambda: dense_cfg(True)])
def test_megatron_hf_megatron_bit_exact(cfg_fn):
    cfg = cfg_fn()
    full = random_megatron_full(cfg)
    again = dict(cv.hf_to_megatron(cv.megatron_to_hf(full, cfg), cfg))
    assert list(again) == list(full)
    for k in full:
        assert torch.equal(again[k], full[k]), k


def test_full_state_matches_real_model_keys(mp):
    for cfg in (moe_cfg(), dense_cfg(False), dense_cfg(True)):
        model = build_megatron(cfg)
        real = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
        full = cv.hf_to_megatron(canonical(hf_model(cfg), cfg), cfg)
        assert {k: full.shape_of(k) for k in full} == real


SHARDINGS = [(2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 2)]


def all_shards(full, cfg, tp, ep, pp):
    return {
        (t, e, p): cv.shard_megatron_state(full, cfg, t, tp, e, ep, p, pp)
        for t in range(tp) for e in range(ep) for p in range(pp)
    }


@pytest.mark.parametrize("sizes", SHARDINGS)
@pytest.mark.parametrize("kind", ["moe", "dense_untied", "dense_tied"])
def test_shard_gather_bit_exact(kind, sizes):
    tp, ep, pp = sizes
    cfg = {"moe": moe_cfg, "dense_untied": lambda: dense_cfg(False), "dense_tied": lambda: dense_cfg(True)}[kind]()
    full = random_megatron_full(cfg)
    if kind != "moe" and ep > 1:
        with pytest.raises(ValueError, match="ep 2 > 1 needs a MoE model"):
            cv.shard_megatron_state(full, cfg, 0, tp, 0, ep, 0, pp)
        return
    shards = all_shards(full, cfg, tp, ep, pp)
    for sd in shards.values():
        for v in sd.values():
            if v is not None:  # no views onto the full tensors
                assert v.untyped_storage().nbytes() == v.numel() * v.element_size()
    gathered = cv.gather_megatron_states(shards, cfg, tp, ep, pp)
    assert list(gathered) == list(full)
    for k in full:
        assert torch.equal(gathered[k], full[k]), k


def test_expert_tp_1_keeps_experts_whole_and_round_trips():
    """slime's layout: TP splits attention and dense parts, experts stay whole on every TP rank."""
    cfg = moe_cfg()
    full = random_megatron_full(cfg)
    shards = {(t, e, 0): cv.shard_megatron_state(full, cfg, t, 2, e, 2, 0, 1, etp_size=1)
              for t in range(2) for e in range(2)}
    fc1 = "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight"
    for t in range(2):  # tp ranks 0 and 1 of ep rank 1 hold the same whole expert 3
        assert torch.equal(shards[t, 1, 0][fc1], full["decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight"])
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    assert shards[0, 0, 0][qkv].shape[0] * 2 == full[qkv].shape[0]  # attention still TP-split
    gathered = cv.gather_megatron_states(shards, cfg, 2, 2, 1, etp_size=1)
    assert all(torch.equal(gathered[k], full[k]) for k in full)
    with pytest.raises(ValueError, match="expert tensor-parallel size 3 is not supported"):
        cv.shard_megatron_state(full, cfg, 0, 2, 0, 2, 0, 1, etp_size=3)
    with pytest.raises(ValueError, match="shard \\(tp=0, ep=0, pp=0\\)"):  # TP-split experts are not ETP-1 shards
        cv.gather_megatron_states(all_shards(full, cfg, 2, 2, 1), cfg, 2, 2, 1, etp_size=1)


def test_shard_slices_by_hand():
    """(tp, ep, pp) = (2, 2, 2): the slices a rank gets, checked against the HF tensors directly."""
    cfg = moe_cfg()
    can = canonical(hf_model(cfg), cfg)
    full = cv.hf_to_megatron(can, cfg)
    sd = cv.shard_megatron_state(full, cfg, tp_rank=1, tp_size=2, ep_rank=1, ep_size=2, pp_rank=1, pp_size=2)
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
    first = cv.shard_megatron_state(full, cfg, 1, 2, 0, 2, 0, 2)
    assert torch.equal(first["embedding.word_embeddings.weight"], can["model.embed_tokens.weight"][V // 2:])
    assert "output_layer.weight" not in first and "decoder.final_layernorm.weight" not in first
    # Dense gated fc1 on tp rank 1: gate rows [I/2:I] then up rows [I/2:I].
    dcfg = dense_cfg(True)
    dcan = canonical(hf_model(dcfg), dcfg)
    dsd = cv.shard_megatron_state(cv.hf_to_megatron(dcan, dcfg), dcfg, 1, 2, 0, 1, 1, 2)
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
        shard = cv.shard_megatron_state(full, cfg, 0, 1, 0, 1, stage, 2)
        assert {k: (None if v is None else tuple(v.shape)) for k, v in shard.items()} == real
        model.load_state_dict(shard, strict=True)
        cv.load_into_model(model, cv.shard_megatron_state(full, cfg, 0, 1, 0, 1, stage, 2, extra_state=False))
    if kind == "dense_tied":
        assert "output_layer.weight" in real  # the last stage of a tied model owns an output layer


def test_tp_shard_shapes():
    cfg = moe_cfg()
    full = random_megatron_full(cfg)
    real = {k: full[k].shape for k in full}
    sd = cv.shard_megatron_state(full, cfg, 0, 2, 0, 2, 0, 1)
    assert sd["embedding.word_embeddings.weight"].shape == (32, 32)
    assert sd["decoder.layers.1.self_attention.linear_qkv.weight"].shape == (real["decoder.layers.1.self_attention.linear_qkv.weight"][0] // 2, 32)
    assert sd["decoder.layers.1.self_attention.linear_proj.weight"].shape == (32, 16)
    assert sd["decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight"].shape == (16, 32)
    assert sd["decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight"].shape == (32, 8)
    assert "decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight" not in sd
    assert sd["decoder.layers.1.mlp.router.weight"].shape == (4, 32)


# ------------------------------------------------------------------------------------------------
# Checkpoint directories and the CLI


def run_cli(*argv):
    return cv.main([str(a) for a in argv])


def test_cli_round_trip_moe(mp, tmp_path, capsys):
    cfg = moe_cfg()
    model = hf_model(cfg)
    hf_dir, mg_dir, out_dir = tmp_path / "hf", tmp_path / "mg", tmp_path / "hf2"
    model.save_pretrained(hf_dir)  # transformers' own writer: per-expert names
    toks = tokens(cfg)
    with torch.no_grad():
        ref = model(toks).logits

    assert run_cli("--to", "megatron", "--hf-dir", hf_dir, "--out", mg_dir, "--tp", 2, "--ep", 2, "--pp", 1) == 0
    printed = capsys.readouterr().out
    assert "(4/4) wrote" in printed
    files = {p.name for p in mg_dir.iterdir()}
    assert files == {"megatron_meta.json"} | {f"mp_rank_{t:02d}_{e:03d}_000.pt" for t in range(2) for e in range(2)}
    meta = json.loads((mg_dir / "megatron_meta.json").read_text())
    assert (meta["tp"], meta["ep"], meta["pp"]) == (2, 2, 1) and meta["hf_config"]["model_type"] == "qwen3_moe"
    shard = torch.load(mg_dir / "mp_rank_01_001_000.pt", weights_only=True)
    can = canonical(model, cfg)
    assert torch.equal(
        shard["decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight"],
        can["model.layers.0.mlp.experts.3.down_proj.weight"][:, 8:],
    )

    # Back to HF with small files, so an index is written.
    assert run_cli("--to", "hf", "--megatron-dir", mg_dir, "--out", out_dir, "--shard-size-mb", 0.02) == 0
    assert (out_dir / "model.safetensors.index.json").is_file()
    assert len(list(out_dir.glob("model-*-of-*.safetensors"))) > 1
    cfg2, src = cv.load_hf_checkpoint(out_dir)
    assert list(src) == sorted(can, key=cv._natural_key) and set(src) == set(can)
    for k in can:
        assert torch.equal(src[k], can[k]), k

    loaded = AutoModelForCausalLM.from_pretrained(out_dir).eval()
    assert type(loaded) is Qwen3MoeForCausalLM
    with torch.no_grad():
        got = loaded(toks).logits
    assert torch.equal(got, ref)

    # The Megatron checkpoint also loads back in Python and gathers to the original weights.
    cfg3, shards, meta = cv.load_megatron_checkpoint(mg_dir)
    full = cv.gather_megatron_states(shards, cfg3, 2, 2, 1)
    ref_full = cv.hf_to_megatron(can, cfg)
    assert all(torch.equal(full[k], ref_full[k]) for k in ref_full)


def test_cli_round_trip_dense_tied_pp2(mp, tmp_path):
    cfg = dense_cfg(True)
    model = hf_model(cfg)
    hf_dir, mg_dir, out_dir = tmp_path / "hf", tmp_path / "mg", tmp_path / "hf2"
    cv.save_hf_checkpoint(hf_dir, cfg, model.state_dict())  # tied lm_head.weight is dropped
    assert (hf_dir / "model.safetensors").is_file() and not (hf_dir / "model.safetensors.index.json").exists()
    assert run_cli("--to", "megatron", "--hf-dir", hf_dir, "--out", mg_dir, "--tp", 2, "--pp", 2) == 0
    last = torch.load(mg_dir / "mp_rank_01_000_001.pt", weights_only=True)
    first = torch.load(mg_dir / "mp_rank_01_000_000.pt", weights_only=True)
    assert torch.equal(last["output_layer.weight"], first["embedding.word_embeddings.weight"])
    assert run_cli("--to", "hf", "--megatron-dir", mg_dir, "--out", out_dir) == 0
    loaded = AutoModelForCausalLM.from_pretrained(out_dir).eval()
    toks = tokens(cfg)
    with torch.no_grad():
        assert torch.equal(loaded(toks).logits, model(toks).logits)


def test_save_hf_checkpoint_bf16_and_in_memory_api(tmp_path):
    cfg = moe_cfg()
    model = hf_model(cfg)
    shards = all_shards(cv.hf_to_megatron(model.state_dict(), cfg), cfg, 1, 2, 2)
    cv.save_megatron_checkpoint(tmp_path / "mg", shards, {"tp": 1, "ep": 2, "pp": 2, "hf_config": cfg, "step": 7})
    cfg2, shards2, meta = cv.load_megatron_checkpoint(tmp_path / "mg")
    assert meta["step"] == 7 and cfg2.to_dict() == cfg.to_dict()
    hf = cv.megatron_to_hf(cv.gather_megatron_states(shards2, cfg2, 1, 2, 2), cfg2)
    cv.save_hf_checkpoint(tmp_path / "hf", cfg2, hf, dtype=torch.bfloat16)
    cfg3, src = cv.load_hf_checkpoint(tmp_path / "hf")
    assert src["model.norm.weight"].dtype == torch.bfloat16
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["dtype"] == "bfloat16"
    can = canonical(model, cfg)
    assert torch.equal(src["model.layers.1.mlp.experts.2.up_proj.weight"], can["model.layers.1.mlp.experts.2.up_proj.weight"].bfloat16())


class CountingMapping(dict):
    """A dict that records which keys were read."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.read: set[str] = set()

    def __getitem__(self, k):
        self.read.add(k)
        return super().__getitem__(k)


def test_sharding_reads_only_the_ranks_tensors(tmp_path):
    cfg = moe_cfg()
    src = CountingMapping(canonical(hf_model(cfg), cfg))
    full = cv.hf_to_megatron(src, cfg)  # (a Mapping without `shape_of` is read for the shape checks)
    src.read.clear()
    cv.shard_megatron_state(full, cfg, 0, 1, ep_rank=1, ep_size=2, pp_rank=1, pp_size=2)
    assert not any(k.startswith("model.layers.0.") for k in src.read)
    assert not any(".experts.0." in k or ".experts.1." in k for k in src.read)
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in src.read and "model.embed_tokens.weight" not in src.read
    # The same through a safetensors directory: shapes come from the headers.
    cv.save_hf_checkpoint(tmp_path, cfg, dict(src), shard_size_mb=0.01)
    cfg2, st = cv.load_hf_checkpoint(tmp_path)
    assert isinstance(st, cv.SafetensorsSource) and st.shape_of("model.layers.1.mlp.gate.weight") == (4, 32)
    shard = cv.shard_megatron_state(cv.hf_to_megatron(st, cfg2), cfg2, 0, 1, 1, 2, 1, 2)
    assert torch.equal(shard["decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight"], src["model.layers.1.mlp.experts.3.down_proj.weight"])
    # Rewriting a checkpoint from itself (lazily, in place) is safe.
    cv.save_hf_checkpoint(tmp_path, cfg2, st)
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == ["model.safetensors"]
    assert not (tmp_path / "model.safetensors.index.json").exists()
    _, st2 = cv.load_hf_checkpoint(tmp_path)
    assert all(torch.equal(st2[k], src[k]) for k in src)


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
    cv.load_into_model(m, shard)
    assert torch.equal(m.layer.self_attention.linear_qkv.layer_norm_weight, torch.full((4,), 2.0))
    assert torch.equal(m.layer.mlp.linear_fc1.layer_norm_weight, torch.full((4,), 3.0))
    assert m.layer.self_attention.linear_qkv.extra is None and torch.equal(m.layer.mlp.linear_fc1.extra, torch.tensor([7]))
    # ... and such names gather back to local-spec names.
    cfg = dense_cfg(False)
    full = random_megatron_full(cfg)
    te = {}
    for k, v in cv.shard_megatron_state(full, cfg, 0, 1).items():
        k = k.replace(".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight")
        te[k.replace(".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight")] = v
    assert "decoder.layers.1.mlp.linear_fc1.layer_norm_weight" in te
    gathered = cv.gather_megatron_states({(0, 0, 0): te}, cfg, 1)
    assert all(torch.equal(gathered[k], full[k]) for k in full)


# ------------------------------------------------------------------------------------------------
# Errors


def test_error_missing_tensor():
    cfg = moe_cfg()
    sd = canonical(hf_model(cfg), cfg)
    del sd["model.layers.1.self_attn.k_norm.weight"]
    with pytest.raises(ValueError, match=r"missing 1 tensor\(s\): model\.layers\.1\.self_attn\.k_norm\.weight"):
        cv.hf_to_megatron(sd, cfg)
    full = random_megatron_full(cfg)
    del full["decoder.layers.0.mlp.experts.local_experts.3.linear_fc2.weight"]
    with pytest.raises(ValueError, match=r"decoder\.layers\.0\.mlp\.experts\.local_experts\.3\.linear_fc2\.weight"):
        cv.megatron_to_hf(full, cfg)
    with pytest.raises(ValueError, match=r"local_experts\.3\.linear_fc2"):
        cv.shard_megatron_state(full, cfg, 0, 1)


def test_error_extra_tensor():
    cfg = dense_cfg(False)
    sd = canonical(hf_model(cfg), cfg)
    sd["model.layers.0.mlp.bias_thing.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"unexpected 1 tensor\(s\).*model\.layers\.0\.mlp\.bias_thing\.weight"):
        cv.hf_to_megatron(sd, cfg)
    # A layer beyond num_hidden_layers is extra too.
    sd = canonical(hf_model(cfg), cfg)
    sd["model.layers.2.input_layernorm.weight"] = torch.ones(32)
    with pytest.raises(ValueError, match=r"model\.layers\.2\.input_layernorm\.weight"):
        cv.hf_to_megatron(sd, cfg)
    full = random_megatron_full(cfg)
    full["decoder.layers.0.mlp.router.weight"] = torch.zeros(4, 32)
    with pytest.raises(ValueError, match=r"unexpected.*decoder\.layers\.0\.mlp\.router\.weight"):
        cv.megatron_to_hf(full, cfg)


def test_error_wrong_shape():
    cfg = moe_cfg()
    sd = canonical(hf_model(cfg), cfg)
    sd["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(16, 32)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_proj\.weight: shape \(16, 32\), config expects \(32, 32\)"):
        cv.hf_to_megatron(sd, cfg)
    fused = dict(hf_model(cfg).state_dict())
    fused["model.layers.1.mlp.experts.down_proj"] = torch.zeros(4, 32, 8)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.experts\.down_proj: shape \(4, 32, 8\), config expects \(4, 32, 16\)"):
        cv.hf_to_megatron(fused, cfg)


def test_error_parallel_sizes():
    cfg = moe_cfg()  # 2 kv heads, 4 experts, 2 layers
    full = random_megatron_full(cfg)
    with pytest.raises(ValueError, match="num_key_value_heads 2 is not divisible by tp 4"):
        cv.shard_megatron_state(full, cfg, 0, 4)
    with pytest.raises(ValueError, match="num_experts 4 is not divisible by ep 3"):
        cv.shard_megatron_state(full, cfg, 0, 1, 0, 3)
    with pytest.raises(ValueError, match="num_hidden_layers 2 is not divisible by pp 4"):
        cv.check_parallel_sizes(cfg, 1, 1, 4)
    with pytest.raises(ValueError, match="tp_rank 2 out of range"):
        cv.shard_megatron_state(full, cfg, 2, 2)


def test_error_gather_and_tied():
    cfg = moe_cfg()
    full = random_megatron_full(cfg)
    shards = all_shards(full, cfg, 2, 1, 1)
    with pytest.raises(ValueError, match=r"missing shards for \(tp, ep, pp\) ranks \[\(1, 0, 0\)\]"):
        cv.gather_megatron_states({(0, 0, 0): shards[0, 0, 0]}, cfg, 2, 1, 1)
    bad = dict(shards[1, 0, 0])
    bad["decoder.layers.0.self_attention.linear_proj.weight"] = torch.zeros(32, 32)
    with pytest.raises(ValueError, match=r"shard \(tp=1, ep=0, pp=0\).*linear_proj\.weight: shape \(32, 32\), config expects \(32, 16\)"):
        cv.gather_megatron_states({**shards, (1, 0, 0): bad}, cfg, 2, 1, 1)
    dcfg = dense_cfg(True)
    sd = canonical(hf_model(dcfg), dcfg)
    sd["lm_head.weight"] = torch.zeros_like(sd["model.embed_tokens.weight"])
    with pytest.raises(ValueError, match="lm_head.weight differs"):
        cv.hf_to_megatron(sd, dcfg)


def test_cli_errors(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_cli("--to", "megatron", "--hf-dir", empty, "--out", tmp_path / "o") == 2
    assert f"has no config.json ({empty / 'config.json'})" in capsys.readouterr().err

    cfg = moe_cfg()
    hf_dir = tmp_path / "hf"
    sd = canonical(hf_model(cfg), cfg)
    cv.save_hf_checkpoint(hf_dir, cfg, sd)
    assert run_cli("--to", "megatron", "--hf-dir", hf_dir, "--out", tmp_path / "o", "--tp", 4) == 2
    assert "num_key_value_heads 2 is not divisible by tp 4" in capsys.readouterr().err

    from safetensors.torch import save_file

    del sd["model.layers.1.mlp.experts.2.up_proj.weight"]
    save_file(sd, str(hf_dir / "model.safetensors"))
    assert run_cli("--to", "megatron", "--hf-dir", hf_dir, "--out", tmp_path / "o") == 2
    assert "model.layers.1.mlp.experts.2.up_proj.weight" in capsys.readouterr().err

    assert run_cli("--to", "megatron", "--hf-dir", hf_dir, "--out", tmp_path / "o2", "--tp", 1) == 2
    capsys.readouterr()
    mg = tmp_path / "mg"
    shards = all_shards(random_megatron_full(cfg), cfg, 1, 2, 1)
    cv.save_megatron_checkpoint(mg, shards, {"tp": 1, "ep": 2, "pp": 1, "hf_config": cfg})
    os.remove(mg / "mp_rank_00_001_000.pt")
    assert run_cli("--to", "hf", "--megatron-dir", mg, "--out", tmp_path / "h") == 2
    assert "missing rank file mp_rank_00_001_000.pt (tp=0, ep=1, pp=0)" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# Real tensor- / expert-parallel models (2 processes, gloo): the shards load strictly and give HF's logits.


def _parallel_worker(rank, world, port, kind, tp, ep, out_dir):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist
    from megatron.core import parallel_state as mps

    from megatron_glue.model_provider import ParallelSizes, build_gpt_model, transformer_config_from_hf
    from megatron_glue.parallel import init_distributed, init_model_parallel, teardown

    init_distributed(rank, world, master_port=port)
    try:
        sizes = ParallelSizes(tp=tp, ep=ep, sequence_parallel=tp > 1)
        init_model_parallel(sizes)
        cfg = moe_cfg() if kind == "moe" else dense_cfg(True)
        hf = hf_model(cfg)
        toks = tokens(cfg, seq=12, seed=1 + mps.get_data_parallel_rank())
        tc = transformer_config_from_hf(cfg, sizes)
        model = build_gpt_model(cfg, tc).eval()
        ranks = (mps.get_tensor_model_parallel_rank(), mps.get_expert_model_parallel_rank())
        shard = cv.shard_megatron_state(cv.hf_to_megatron(hf.state_dict(), cfg), cfg, ranks[0], tp, ranks[1], ep)
        model.load_state_dict(shard, strict=True)
        pos = torch.arange(toks.shape[1])[None].expand(toks.shape[0], -1)
        with torch.no_grad():
            out = model(toks, pos, attention_mask=None)
            if tp > 1:  # vocab-parallel logits
                parts = [torch.empty_like(out) for _ in range(tp)]
                dist.all_gather(parts, out.contiguous(), group=mps.get_tensor_model_parallel_group())
                out = torch.cat(parts, -1)
            ref = hf(toks).logits
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"ranks": ranks, "diff": (out - ref).abs().max().item(), "shape": list(out.shape)}, f)
    finally:
        teardown()


@pytest.mark.parametrize("kind,tp,ep", [("moe", 2, 1), ("moe", 1, 2), ("dense_tied", 2, 1)])
def test_real_parallel_models_match_hf(tmp_path, kind, tp, ep):
    import torch.multiprocessing as tmp

    from megatron_glue.parallel import free_port

    tmp.spawn(_parallel_worker, args=(2, free_port(), kind, tp, ep, str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert sorted(tuple(r["ranks"]) for r in results) == ([(0, 0), (1, 0)] if tp == 2 else [(0, 0), (0, 1)])
    for r in results:
        assert r["shape"] == [2, 12, 64]
        MAX_DIFFS[f"{kind}_tp{tp}_ep{ep}"] = max(MAX_DIFFS.get(f"{kind}_tp{tp}_ep{ep}", 0.0), r["diff"])
        print(f"max |megatron - hf| logits ({kind}, tp={tp}, ep={ep}, ranks={r['ranks']}): {r['diff']:.3g}")
        assert r["diff"] < 1e-4
