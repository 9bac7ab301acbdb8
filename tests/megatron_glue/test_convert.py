"""megatron_glue.convert: the command-line tool (`python -m megatron_glue.convert --to megatron|hf`).

Megatron's parallel state is process-global, so every test that builds a Megatron model uses the
module-scoped `mp` fixture (one process, TP = PP = EP = 1).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from megatron_glue import checkpoint_io as cio
from megatron_glue import convert as cv
from megatron_glue import sharding as sh
from megatron_glue import weight_names as wn

import transformers  # noqa: E402  (a hard dependency: a missing install must fail, not skip)
from transformers import AutoModelForCausalLM, Qwen3MoeForCausalLM  # noqa: E402

from tests.conversion_fixtures import (  # noqa: E402
    all_shards,
    canonical,
    dense_cfg,
    hf_model,
    moe_cfg,
    mp,  # noqa: F401  (pytest fixture)
    random_megatron_full,
    tokens,
)


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
    cfg2, src = cio.load_hf_checkpoint(out_dir)
    assert list(src) == sorted(can, key=wn.natural_key) and set(src) == set(can)
    for k in can:
        assert torch.equal(src[k], can[k]), k

    loaded = AutoModelForCausalLM.from_pretrained(out_dir).eval()
    assert type(loaded) is Qwen3MoeForCausalLM
    with torch.no_grad():
        got = loaded(toks).logits
    assert torch.equal(got, ref)

    # The Megatron checkpoint also loads back in Python and gathers to the original weights.
    cfg3, shards, meta = cio.load_megatron_checkpoint(mg_dir)
    full = sh.gather_megatron_states(shards, cfg3, 2, 2, 1)
    ref_full = wn.hf_to_megatron(can, cfg)
    assert all(torch.equal(full[k], ref_full[k]) for k in ref_full)


def test_cli_round_trip_dense_tied_pp2(mp, tmp_path):
    cfg = dense_cfg(True)
    model = hf_model(cfg)
    hf_dir, mg_dir, out_dir = tmp_path / "hf", tmp_path / "mg", tmp_path / "hf2"
    cio.save_hf_checkpoint(hf_dir, cfg, model.state_dict())  # tied lm_head.weight is dropped
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


def test_cli_errors(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_cli("--to", "megatron", "--hf-dir", empty, "--out", tmp_path / "o") == 2
    assert f"has no config.json ({empty / 'config.json'})" in capsys.readouterr().err

    cfg = moe_cfg()
    hf_dir = tmp_path / "hf"
    sd = canonical(hf_model(cfg), cfg)
    cio.save_hf_checkpoint(hf_dir, cfg, sd)
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
    cio.save_megatron_checkpoint(mg, shards, {"tp": 1, "ep": 2, "pp": 1, "hf_config": cfg})
    os.remove(mg / "mp_rank_00_001_000.pt")
    assert run_cli("--to", "hf", "--megatron-dir", mg, "--out", tmp_path / "h") == 2
    assert "missing rank file mp_rank_00_001_000.pt (tp=0, ep=1, pp=0)" in capsys.readouterr().err
