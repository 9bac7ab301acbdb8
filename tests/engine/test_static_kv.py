"""The static-KV forward against transformers' forward: same logits, same tokens, and its own mechanics
(chunked prefill, cache growth, lazy compaction, the grouped-matmul fallback, unsupported models)."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from sglang_patches.decoding import SamplingParams
from slime_ext.data.generation import GenerateRequest
from slime_ext.engine import static_kv
from slime_ext.engine.embedded import EmbeddedEngine
from slime_ext.engine.prefix_cache import PrefixCache
from slime_ext.algo.grouped_matmul import grouped_mm_runs
from tests.megatron_fixtures import tiny_dense_config, tiny_moe_config


@pytest.fixture(scope="module")
def moe():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_moe_config(initializer_range=0.5)).eval()


def _last_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


def _workload(n=10, seed=0):
    rng = random.Random(seed)
    return [GenerateRequest(f"r{i}", [rng.randrange(2, 64) for _ in range(rng.randint(1, 12))],
                            SamplingParams(temperature=1.0 if i % 3 else 0.0, max_new_tokens=rng.randint(1, 14)),
                            seed=i, return_logprob=True) for i in range(n)]


def test_static_and_hf_kernels_generate_the_same_tokens_and_logprobs(moe, monkeypatch):
    monkeypatch.setattr(static_kv, "CAPACITY_SLACK", 2)  # rows outgrow the cache: growth is exercised
    monkeypatch.setattr(static_kv, "PREFILL_ATTENTION_ELEMENTS", 300)  # prefill runs in several chunks
    static = EmbeddedEngine(moe, 1, kernel="static").generate(_workload())
    hf = EmbeddedEngine(moe, 1, kernel="hf").generate(_workload())
    assert [r.output_ids for r in static] == [r.output_ids for r in hf]
    assert [r.finish_reason for r in static] == [r.finish_reason for r in hf]
    diff = max(abs(a - b) for s, h in zip(static, hf) for a, b in zip(s.logprobs, h.logprobs))
    assert diff < 1e-5


def test_prefill_steps_select_and_prefix_reuse_match_full_forwards(moe, monkeypatch):
    monkeypatch.setattr(static_kv, "PREFILL_ATTENTION_ELEMENTS", 200)
    rng = random.Random(1)
    inputs = [[rng.randrange(2, 64) for _ in range(rng.randint(2, 15))] for _ in range(8)]
    state = static_kv.StaticKVState(moe, PrefixCache())
    assert len(state._prefill_chunks(inputs, [(0, None)] * 8)) > 1
    logits, used = state.prefill(inputs)
    assert used == [0] * 8
    seqs = [list(x) for x in inputs]
    worst = max(float((logits[i] - _last_logits(moe, ids)).abs().max()) for i, ids in enumerate(seqs))
    # float32 rounding differs between the packed and the full forward (and between CPUs): the bound scales
    # with the logits (|logit| up to ~8 here); a wrong KV row or position is off by O(1)
    tolerance = 4e-6 * max(1.0, float(logits.abs().max()))
    # (rows kept, compactions after): 1 dead of 8 only remaps; 2 dead of 8 (a quarter) compacts; then every
    # drop of a 6-row batch compacts (a quarter of 6 rounds down to one row)
    for keep, compactions in ((list(range(8)), 0), ([7, 0, 1, 2, 3, 4, 5], 0), ([0, 1, 2, 3, 4, 6], 1),
                              ([5, 3, 1, 0], 2), ([2], 3)):
        state.select(torch.tensor(keep))
        seqs = [seqs[i] for i in keep]
        assert state.compactions == compactions and state.own[0][0].shape[0] in (len(keep), 8, 7)
        tokens = torch.tensor([rng.randrange(2, 64) for _ in seqs])
        for s, t in zip(seqs, tokens.tolist()):
            s.append(t)
        out = state.step(tokens)
        worst = max(worst, max(float((out[i] - _last_logits(moe, ids)).abs().max()) for i, ids in enumerate(seqs)))
        assert [state.fed(i) for i in range(len(seqs))] == [len(s) for s in seqs]
    assert worst < tolerance
    cont = inputs[4] + [7, 8]
    again = static_kv.StaticKVState(moe, state.store)
    logits, used = again.prefill([cont])
    assert used == [len(inputs[4])]  # the prefill's stored KV is reused
    assert float((logits[0] - _last_logits(moe, cont)).abs().max()) < tolerance


def test_grouped_matmul_fallback_equals_grouped_mm():
    gen = torch.Generator().manual_seed(0)
    counts = torch.tensor([3, 0, 5, 2])
    offsets = counts.cumsum(0).to(torch.int32)
    for width, out in ((8, 12), (6, 7)):  # grouped_mm (16-byte strides), then the loop (odd widths)
        assert grouped_mm_runs(torch.zeros(1, width), torch.zeros(4, out, width)) == (width == 8)
        x = torch.randn(sum(counts), width, generator=gen)
        weight = torch.randn(4, out, width, generator=gen)
        expected = torch.cat([x[s:s + c] @ weight[e].T for e, (s, c) in enumerate(zip([0, 3, 3, 8], counts.tolist())) if c])
        torch.testing.assert_close(static_kv._grouped_linear(x, weight, counts, offsets), expected)
        torch.testing.assert_close(static_kv._grouped_linear(x.double(), weight.double(), counts, offsets),
                                   expected.double(), atol=1e-5, rtol=1e-5)


def test_dense_qwen3_is_supported_and_other_models_keep_the_hf_kernel(moe):
    torch.manual_seed(0)
    dense = AutoModelForCausalLM.from_config(tiny_dense_config(initializer_range=0.5)).eval()
    assert static_kv.supports(dense) and static_kv.supports(moe)
    reqs = _workload(4)
    a = EmbeddedEngine(dense, 1, kernel="static").generate(reqs)
    b = EmbeddedEngine(dense, 1, kernel="hf").generate(_workload(4))
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    from transformers import LlamaConfig

    llama = AutoModelForCausalLM.from_config(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                         num_hidden_layers=1, num_attention_heads=2,
                                                         num_key_value_heads=1)).eval()
    assert "llama" in static_kv.unsupported_reason(llama)
    auto = EmbeddedEngine(llama, 1)
    assert not isinstance(auto._state(llama, auto.prefix_cache, None), static_kv.StaticKVState)
    assert len(auto.generate(_workload(2))[0].output_ids) >= 1
    with pytest.raises(ValueError, match="kernel 'static' cannot run the model"):
        EmbeddedEngine(llama, 1, kernel="static")
    with pytest.raises(ValueError, match="engine kernel must be one of"):
        EmbeddedEngine(moe, 1, kernel="fast")


def test_engine_kernel_key_reaches_the_engines():
    from types import SimpleNamespace

    from slime_ext.config import load_config
    from slime_ext.engine.engine_server import server_command
    from slime_ext.tools.serve import parse_args

    assert load_config("configs/grpo.yaml").config.rollout.engine_kernel == "auto"
    assert load_config("configs/grpo.yaml", ["rollout.engine_kernel=hf"]).config.rollout.engine_kernel == "hf"
    with pytest.raises(Exception, match="engine_kernel"):
        load_config("configs/grpo.yaml", ["rollout.engine_kernel=fast"])
    sg = SimpleNamespace(host="127.0.0.1")
    argv, _ = server_command(sg, "/m", 1234, use_sglang=False, kernel="hf")
    assert argv[argv.index("--kernel") + 1] == "hf"
    assert "--kernel" not in server_command(sg, "/m", 1234, use_sglang=False)[0]
    assert parse_args(["--model", "/m", "--kernel", "static"]).kernel == "static"
    with pytest.raises(ValueError, match="SGLang servers, which run their own kernels"):
        server_command(sg, "/m", 1234, use_sglang=True, kernel="static")
