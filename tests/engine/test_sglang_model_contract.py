"""SGLang's own Qwen3-MoE model is the contract of the `tensor` weight-sync path.

The trainer's Megatron values go out as our export makes them (`megatron_param_to_hf` per tensor, buckets by
the ranks' rule) through the real `tensor` wire (`weight_sync.ServerTarget(kind="tensor").open(...)`: SGLang's
`FlattenedTensorBucket`, its `MultiprocessingSerializer`, one entry per engine TP rank), and the request
bodies it builds are applied by SGLang's own TP-worker and weight-updater code to SGLang's own
`Qwen3MoeForCausalLM` built on CPU (tests/sglang_model_host.py), at engine TP 1 and TP 2. Every fused
parameter (qkv_proj, experts.w13_weight / w2_weight) and every plain one must then equal, bit for bit in the
engine dtype, the slice of the trainer's values computed here from Megatron's own layout (query groups of
linear_qkv, [gate; up] rows of linear_fc1): an independent reference, not our conversion run backwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conversion_fixtures import moe_cfg, random_megatron_full

pytest.importorskip("sglang.srt.weight_sync.tensor_bucket")  # the real package (scripts/install_sglang_cpu.sh)

HOST = Path(__file__).resolve().parents[1] / "sglang_model_host.py"
ROOT = Path(__file__).resolve().parents[2]


def _export(cfg) -> tuple[dict, list]:
    """The trainer's full Megatron values and the HF-named tensors our export sends for them."""
    from megatron_glue.weight_names import megatron_param_to_hf

    full = random_megatron_full(cfg, seed=11)
    named = [pair for name, tensor in full.items() for pair in megatron_param_to_hf(name, tensor, cfg)]
    return full, named


def _bodies_from_the_tensor_wire(named: list, dtype: str, tp_size: int, keep: list) -> list[dict]:
    """The `/update_weights_from_tensor` bodies our `tensor` wire builds (each validated against io_struct by
    the real client), captured instead of posted. `keep` holds the buckets: their shared-memory storage must
    outlive the engine processes' reads, as it does while a real request is in flight."""
    from slime_ext.engine.sglang_client import SGLangEngineClient
    from slime_ext.engine.weight_sync import LocalWeightSource, ServerTarget

    bodies: list[dict] = []

    class Capture(SGLangEngineClient):
        def update_weights_from_flattened_bucket(self, bucket, **kw):
            keep.append(bucket)
            return super().update_weights_from_flattened_bucket(bucket, **kw)

        def _control(self, path, payload, class_name):
            from slime_ext.engine.sglang_payload import validate_payload

            validate_payload(payload, class_name)
            if path == "/update_weights_from_tensor":
                bodies.append(payload)
            return {"success": True}

    target = ServerTarget("tensor", ["http://127.0.0.1:9"], engine_dtype=dtype, tp_size=tp_size)
    target.clients = lambda: [Capture(u, tp_size=tp_size) for u in target.urls]  # type: ignore[method-assign]
    source = LocalWeightSource([(n, t.clone()) for n, t in named], bucket_bytes=6 << 10)  # several buckets
    stats = source.push_weights(target)[0]
    assert stats["buckets"] == len(bodies) > 3 and stats["payloads"] == 0  # dense: flattened buckets, no payloads
    return bodies


def _run_engine(tmp_path: Path, cfg, bodies: list[dict], tp_size: int, dtype: str) -> list[dict]:
    from slime_ext.engine.engine_server import free_port

    (tmp_path / "cfg.json").write_text(json.dumps(cfg.to_dict()))
    (tmp_path / "bodies.json").write_text(json.dumps(bodies))
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [subprocess.Popen([sys.executable, str(HOST), "--config", str(tmp_path / "cfg.json"), "--bodies",
                               str(tmp_path / "bodies.json"), "--tp-size", str(tp_size), "--tp-rank", str(r),
                               "--port", str(port), "--dtype", dtype, "--out", str(tmp_path / f"rank{r}.pt")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(tp_size)]
    for r, p in enumerate(procs):
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, f"engine TP rank {r} failed (packages: scripts/install_sglang_cpu.sh):\n{out[-4000:]}"
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(tp_size)]


def _expected_rank(full: dict, cfg, tp_size: int, r: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """What SGLang's TP rank `r` must hold, cut from the Megatron values by Megatron's own layout."""
    hd, nq, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    q_per_group, inter, vocab = nq // nkv, cfg.moe_intermediate_size, cfg.vocab_size

    def rows(t: torch.Tensor, n: int) -> torch.Tensor:  # rank r's n-th of the rows
        size = t.shape[0] // n
        return t[r * size:(r + 1) * size]

    def cols(t: torch.Tensor, n: int) -> torch.Tensor:
        size = t.shape[1] // n
        return t[:, r * size:(r + 1) * size]

    out = {"model.embed_tokens.weight": rows(full["embedding.word_embeddings.weight"], tp_size),
           "lm_head.weight": rows(full["output_layer.weight"], tp_size),
           "model.norm.weight": full["decoder.final_layernorm.weight"]}
    groups = range(r * nkv // tp_size, (r + 1) * nkv // tp_size)
    for layer in range(cfg.num_hidden_layers):
        meg, sg = f"decoder.layers.{layer}.", f"model.layers.{layer}."
        qkv = full[meg + "self_attention.linear_qkv.weight"].view(nkv, (q_per_group + 2) * hd, -1)
        q = torch.cat([qkv[g, :q_per_group * hd] for g in groups])
        k = torch.cat([qkv[g, q_per_group * hd:(q_per_group + 1) * hd] for g in groups])
        v = torch.cat([qkv[g, (q_per_group + 1) * hd:] for g in groups])
        out[sg + "self_attn.qkv_proj.weight"] = torch.cat([q, k, v])
        out[sg + "self_attn.o_proj.weight"] = cols(full[meg + "self_attention.linear_proj.weight"], tp_size)
        out[sg + "self_attn.q_norm.weight"] = full[meg + "self_attention.q_layernorm.weight"]
        out[sg + "self_attn.k_norm.weight"] = full[meg + "self_attention.k_layernorm.weight"]
        out[sg + "input_layernorm.weight"] = full[meg + "input_layernorm.weight"]
        out[sg + "post_attention_layernorm.weight"] = full[meg + "pre_mlp_layernorm.weight"]
        out[sg + "mlp.gate.weight"] = full[meg + "mlp.router.weight"]
        fc1 = [full[meg + f"mlp.experts.local_experts.{e}.linear_fc1.weight"] for e in range(cfg.num_experts)]
        fc2 = [full[meg + f"mlp.experts.local_experts.{e}.linear_fc2.weight"] for e in range(cfg.num_experts)]
        out[sg + "mlp.experts.w13_weight"] = torch.stack([torch.cat([rows(w[:inter], tp_size), rows(w[inter:], tp_size)])
                                                         for w in fc1])
        out[sg + "mlp.experts.w2_weight"] = torch.stack([cols(w, tp_size) for w in fc2])
    assert vocab % tp_size == 0
    return {name: t.to(dtype) for name, t in out.items()}


@pytest.mark.parametrize("tp_size,dtype", [(1, "float32"), (2, "bfloat16")])
def test_sglang_qwen3_moe_loads_what_the_tensor_wire_sends_bit_for_bit(tmp_path, tp_size, dtype):
    cfg = moe_cfg()
    full, named = _export(cfg)
    keep: list = []
    bodies = _bodies_from_the_tensor_wire(named, dtype, tp_size, keep)
    assert all(b["load_format"] == "flattened_bucket" and len(b["serialized_named_tensors"]) == tp_size for b in bodies)
    loaded = _run_engine(tmp_path, cfg, bodies, tp_size, dtype)
    for r, params in enumerate(loaded):
        expected = _expected_rank(full, cfg, tp_size, r, getattr(torch, dtype))
        assert set(params) == set(expected), sorted(set(params) ^ set(expected))
        for name, want in expected.items():
            got = params[name]
            assert got.dtype == want.dtype and got.shape == want.shape, (r, name, got.shape, want.shape)
            assert not torch.isnan(got).any(), f"rank {r}: {name} has elements no bucket reached"
            assert torch.equal(got, want), f"rank {r}: {name} differs from the trainer's values"
    del keep
