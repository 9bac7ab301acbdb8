"""The static-KV engine keeps a prompt's KV once for its n samples: the outputs are those of the former
duplicate-copy cache, and the memory held is prompts once plus each row's generated tokens.

`tests/engine/data/shared_prompt_kv_reference.json` holds the outputs the engine gave before the prompt KV
was shared (every sample held its own copy of the prompt's KV), recorded from commit 68a829c with
`python -m tests.engine.test_shared_prompt_kv --record`. The workload covers n > 1 samples of prompts of
different lengths in a shuffled order, sampled and greedy rows, rows finishing at different steps (lazy
compaction), cache growth, chunked prefill, continuations that reuse a finished row's KV from the prefix
cache, and routing recording on the MoE model.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from sglang_patches.decoding import SamplingParams
from slime_ext.data.generation import GenerateRequest, GenerateResult
from slime_ext.engine import static_kv
from slime_ext.engine.embedded import EmbeddedEngine
from slime_ext.engine.prefix_cache import PrefixCache
from tests.megatron_fixtures import tiny_dense_config, tiny_moe_config

REFERENCE = Path(__file__).parent / "data" / "shared_prompt_kv_reference.json"
EOS = 1
SAMPLES = 4
PROMPT_LENGTHS = (3, 7, 12, 20)


def _model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = tiny_moe_config if kind == "moe" else tiny_dense_config
    return AutoModelForCausalLM.from_config(config(initializer_range=0.5)).eval()


def _first_call(record: bool) -> list[GenerateRequest]:
    """n samples of prompts of different lengths, shuffled so one prompt's samples are not adjacent."""
    rng = random.Random(0)
    prompts = [[rng.randrange(2, 64) for _ in range(n)] for n in PROMPT_LENGTHS]
    requests = []
    for i, prompt in enumerate(prompts):
        for j in range(SAMPLES):
            sampling = SamplingParams(temperature=0.0 if (i + j) % 3 == 0 else 1.0,
                                      max_new_tokens=rng.randint(4, 24))
            requests.append(GenerateRequest(f"p{i}s{j}", prompt, sampling, seed=10 * i + j, return_logprob=True,
                                            return_routed_experts=record))
    rng.shuffle(requests)
    return requests


def _continuations(first: list[GenerateRequest], results: list[GenerateResult], record: bool) -> list[GenerateRequest]:
    """Two samples of each of two first-call rows' prompt + response + appended text (prefix-cache hits)."""
    out = []
    for req, res in list(zip(first, results))[:2]:
        ids = req.input_ids + res.output_ids[:-1] + [5, 6]
        for j in range(2):
            out.append(GenerateRequest(f"{req.rid}c{j}", ids, SamplingParams(temperature=1.0, max_new_tokens=9),
                                       seed=100 + j, return_logprob=True, return_routed_experts=record))
    return out


def _summary(results: list[GenerateResult]) -> list[dict[str, Any]]:
    return [{"rid": r.rid, "output_ids": r.output_ids, "logprobs": r.logprobs, "finish_reason": r.finish_reason,
             "cached_tokens": r.cached_tokens,
             "routed_experts": None if r.routed_experts is None else r.routed_experts.tolist()} for r in results]


def run_workload() -> dict[str, list[dict[str, Any]]]:
    """The static-KV engine's outputs on the workload, for the dense model and (recording routing) the MoE
    model. Small capacity slack and prefill chunks make growth and chunked prefill happen."""
    saved = static_kv.CAPACITY_SLACK, static_kv.PREFILL_ATTENTION_ELEMENTS
    static_kv.CAPACITY_SLACK, static_kv.PREFILL_ATTENTION_ELEMENTS = 3, 4000
    try:
        out = {}
        for kind in ("dense", "moe"):
            record = kind == "moe"
            engine = EmbeddedEngine(_model(kind), EOS, kernel="static")
            first = _first_call(record)
            results = engine.generate(first)
            again = engine.generate(_continuations(first, results, record))
            out[kind] = _summary(results) + _summary(again)
        return out
    finally:
        static_kv.CAPACITY_SLACK, static_kv.PREFILL_ATTENTION_ELEMENTS = saved


def test_outputs_equal_those_of_the_duplicate_copy_cache():
    reference = json.loads(REFERENCE.read_text())
    got = run_workload()
    for kind in ("dense", "moe"):
        ref, new = reference[kind], got[kind]
        assert [r["rid"] for r in new] == [r["rid"] for r in ref]
        assert any(r["cached_tokens"] > 0 for r in ref)  # the continuations did reuse stored KV
        assert [r["output_ids"] for r in new] == [r["output_ids"] for r in ref], kind
        assert [r["finish_reason"] for r in new] == [r["finish_reason"] for r in ref], kind
        assert [r["cached_tokens"] for r in new] == [r["cached_tokens"] for r in ref], kind
        assert [r["routed_experts"] for r in new] == [r["routed_experts"] for r in ref], kind
        # logprobs to float32 rounding relative to the logits' scale (|logprob| here is a few units)
        scale = max(1.0, max(abs(x) for r in ref for x in r["logprobs"]))
        worst = max(abs(a - b) for r, s in zip(ref, new) for a, b in zip(r["logprobs"], s["logprobs"]))
        assert worst < 1e-5 * scale, (kind, worst)


if __name__ == "__main__" and "--record" in sys.argv:
    REFERENCE.parent.mkdir(exist_ok=True)
    REFERENCE.write_text(json.dumps(run_workload()) + "\n")
    print(f"wrote {REFERENCE}")


def test_the_prompt_kv_is_held_once_for_its_samples(monkeypatch):
    monkeypatch.setattr(static_kv, "CAPACITY_SLACK", 16)  # own slots per row before the first growth
    state = static_kv.StaticKVState(_model("moe"), PrefixCache())
    rng = random.Random(2)
    prompt = [rng.randrange(2, 64) for _ in range(100)]
    state.prefill([prompt])
    state.select(torch.zeros(8, dtype=torch.long))  # 8 samples of the prompt
    # a token's KV: 2 layers x (K + V) x 2 kv heads x 8 dims x 4 bytes = 256 bytes. The prompt once plus 8 rows
    # x 16 own slots: (100 + 8 * 16) * 256 = 58,368 bytes; 8 copies of prompt + slots would be
    # 8 * (100 + 16) * 256 = 237,568
    assert state.kv_bytes() == 58_368
    for _ in range(17):  # the 17th token outgrows 16 own slots: own capacity doubles, the prompt does not
        state.step(torch.tensor([rng.randrange(2, 64) for _ in range(8)]))
    assert state.kv_bytes() == (100 + 8 * 32) * 256
    k, v = state.row_kv(3)[1]  # a row's full KV for the prefix cache: the shared prompt's, then its own
    assert k.shape == v.shape == (2, 117, 8)
    assert torch.equal(k[:, :100], state.prompts[1][0][0]) and torch.equal(k[:, 100:], state.own[1][0][3, :, :17])


def test_compaction_drops_prompts_no_row_samples(monkeypatch):
    monkeypatch.setattr(static_kv, "CAPACITY_SLACK", 16)
    model = _model("dense")
    state = static_kv.StaticKVState(model, PrefixCache())
    rng = random.Random(3)
    long, short = ([rng.randrange(2, 64) for _ in range(n)] for n in (100, 40))
    state.prefill([long, short])
    state.select(torch.tensor([0, 1, 0, 1, 0, 1, 0, 1]))  # 4 samples each, interleaved
    assert state.kv_bytes() == (2 * 100 + 8 * 16) * 256  # prompts padded to the longest: 83,968 bytes
    state.step(torch.arange(2, 10))
    state.select(torch.tensor([1, 3, 5, 7]))  # the long prompt's rows finished: half the rows are dead
    assert state.compactions == 2 and state.prompts[0][0].shape[:3] == (1, 2, 40)
    assert state.kv_bytes() == (40 + 4 * 16) * 256  # 26,624 bytes
    assert [state.fed(i) for i in range(4)] == [41] * 4
    logits = state.step(torch.tensor([11, 12, 13, 14]))  # the kept rows still read the right prompt and own KV
    with torch.no_grad():
        full = model(input_ids=torch.tensor([short + [3 + 2 * i, 11 + i] for i in range(4)])).logits[:, -1]
    assert float((logits - full).abs().max()) < 4e-6 * max(1.0, float(full.abs().max()))
