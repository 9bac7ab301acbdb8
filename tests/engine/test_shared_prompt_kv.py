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
