"""megatron_glue.checkpoint_io: HF and Megatron checkpoint directories, lazy safetensors reading."""

from __future__ import annotations

import json

import pytest
import torch

from megatron_glue import checkpoint_io as cio
from megatron_glue import sharding as sh
from megatron_glue import weight_names as wn

import transformers  # noqa: E402  (a hard dependency: a missing install must fail, not skip)

from tests.conversion_fixtures import all_shards, canonical, hf_model, moe_cfg  # noqa: E402


def test_save_hf_checkpoint_bf16_and_in_memory_api(tmp_path):
    cfg = moe_cfg()
    model = hf_model(cfg)
    shards = all_shards(wn.hf_to_megatron(model.state_dict(), cfg), cfg, 1, 2, 2)
    cio.save_megatron_checkpoint(tmp_path / "mg", shards, {"tp": 1, "ep": 2, "pp": 2, "hf_config": cfg, "step": 7})
    cfg2, shards2, meta = cio.load_megatron_checkpoint(tmp_path / "mg")
    assert meta["step"] == 7 and cfg2.to_dict() == cfg.to_dict()
    hf = wn.megatron_to_hf(sh.gather_megatron_states(shards2, cfg2, 1, 2, 2), cfg2)
    cio.save_hf_checkpoint(tmp_path / "hf", cfg2, hf, dtype=torch.bfloat16)
    cfg3, src = cio.load_hf_checkpoint(tmp_path / "hf")
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
    full = wn.hf_to_megatron(src, cfg)  # (a Mapping without `shape_of` is read for the shape checks)
    src.read.clear()
    sh.shard_megatron_state(full, cfg, 0, 1, ep_rank=1, ep_size=2, pp_rank=1, pp_size=2)
    assert not any(k.startswith("model.layers.0.") for k in src.read)
    assert not any(".experts.0." in k or ".experts.1." in k for k in src.read)
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in src.read and "model.embed_tokens.weight" not in src.read
    # The same through a safetensors directory: shapes come from the headers.
    cio.save_hf_checkpoint(tmp_path, cfg, dict(src), shard_size_mb=0.01)
    cfg2, st = cio.load_hf_checkpoint(tmp_path)
    assert isinstance(st, cio.SafetensorsSource) and st.shape_of("model.layers.1.mlp.gate.weight") == (4, 32)
    shard = sh.shard_megatron_state(wn.hf_to_megatron(st, cfg2), cfg2, 0, 1, 1, 2, 1, 2)
    assert torch.equal(shard["decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight"], src["model.layers.1.mlp.experts.3.down_proj.weight"])
    # Rewriting a checkpoint from itself (lazily, in place) is safe.
    cio.save_hf_checkpoint(tmp_path, cfg2, st)
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == ["model.safetensors"]
    assert not (tmp_path / "model.safetensors.index.json").exists()
    _, st2 = cio.load_hf_checkpoint(tmp_path)
    assert all(torch.equal(st2[k], src[k]) for k in src)
