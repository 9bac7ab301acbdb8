"""Routed-expert recording in the embedded engine (rollout routing replay, docs/routing-replay.md)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from sglang_patches.decoding import SamplingParams
from slime_ext.data.generation import GenerateRequest
from slime_ext.engine.embedded import EmbeddedEngine, RoutingRecorder
from tests.megatron_fixtures import tiny_dense_config, tiny_moe_config

EOS = 1
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [18], [20, 21, 22, 23, 24], [25, 26, 27]]


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = tiny_moe_config(initializer_range=0.5, num_experts=8, num_experts_per_tok=2, num_hidden_layers=3)
    return AutoModelForCausalLM.from_config(cfg).eval()


def reqs(n: int = 6, max_new: int = 12, record: bool = True, prompts=PROMPTS, **kw) -> list[GenerateRequest]:
    sp = SamplingParams(temperature=1.0, max_new_tokens=max_new)
    return [GenerateRequest(f"r{i}", list(prompts[i % len(prompts)]), sp, seed=i, return_routed_experts=record, **kw)
            for i in range(n)]


def hf_topk(model, ids: list[int]) -> torch.Tensor:
    """The router top-k of one plain HF forward over `ids`: [len(ids), moe_layers, top_k]."""
    rec = RoutingRecorder(model)
    with rec, torch.no_grad():
        model(torch.tensor([ids]))
        return rec.take()


def same_sets(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.sort(-1).values, b.sort(-1).values)


def test_recorded_routing_equals_a_direct_forward_token_for_token(model, both_kernels):
    results = EmbeddedEngine(model, EOS).generate(reqs())
    for req, res in zip(reqs(), results):
        fed = req.input_ids + res.output_ids[:-1]
        assert res.routed_experts.dtype == torch.int16
        assert tuple(res.routed_experts.shape) == (len(fed), 3, 2)
        # an independent hook: register_forward_hook on each HF router, separate from the engine's recorder
        captured = []
        handles = [m.gate.register_forward_hook(lambda _m, _i, out: captured.append(out[2]))
                   for m in model.modules() if type(m).__name__ == "Qwen3MoeSparseMoeBlock"]
        try:
            with torch.no_grad():
                model(torch.tensor([fed]))
        finally:
            for h in handles:
                h.remove()
        direct = torch.stack(captured, dim=1)
        assert torch.equal(res.routed_experts.long(), direct), req.rid
        assert res.routed_experts.min() >= 0 and res.routed_experts.max() < 8


def test_batching_with_early_finishing_rows_and_prefix_hits_equal_single_requests(model, both_kernels):
    # rows of different prompts finish at different steps (EOS or a per-request max_new_tokens)
    batch = reqs()
    for i, r in enumerate(batch):
        r.sampling = SamplingParams(temperature=1.0, max_new_tokens=3 + 2 * i)
    batched = EmbeddedEngine(model, EOS).generate(batch)
    assert len({len(r.output_ids) for r in batched}) > 2
    for req, res in zip(batch, batched):
        alone = EmbeddedEngine(model, EOS).generate([req])[0]
        assert alone.output_ids == res.output_ids
        assert torch.equal(alone.routed_experts, res.routed_experts)
        assert same_sets(res.routed_experts, hf_topk(model, req.input_ids + res.output_ids[:-1]))

    # prefix-cache hit: a continuation of each result reuses its cached prompt + response with their routing
    engine = EmbeddedEngine(model, EOS)
    first = engine.generate(batch)
    cont = [GenerateRequest(f"c{i}", r.input_ids + res.output_ids + [30, 31], SamplingParams(temperature=1.0, max_new_tokens=4),
                            seed=50 + i, return_routed_experts=True) for i, (r, res) in enumerate(zip(batch, first))]
    hit = engine.generate(cont)
    assert all(h.cached_tokens > 0 for h in hit)
    fresh = EmbeddedEngine(model, EOS).generate(cont)
    for h, f, req in zip(hit, fresh, cont):
        assert f.cached_tokens == 0 and h.output_ids == f.output_ids
        assert torch.equal(h.routed_experts, f.routed_experts)
        # the reused prefix's routing is the first call's (prompt + output[:-1]); the rest was computed now
        n = first[int(req.rid[1:])].routed_experts.shape[0]
        assert torch.equal(h.routed_experts[:n], first[int(req.rid[1:])].routed_experts)


def test_prefix_cached_without_routing_is_recomputed_for_a_recording_request(model, both_kernels):
    engine = EmbeddedEngine(model, EOS)
    plain = engine.generate(reqs(n=2, record=False))
    assert all(r.routed_experts is None for r in plain)
    again = engine.generate(reqs(n=2, record=True))
    assert all(r.cached_tokens == 0 for r in again)  # the cached prompts had no routing: recomputed
    fresh = EmbeddedEngine(model, EOS).generate(reqs(n=2, record=True))
    assert all(torch.equal(a.routed_experts, b.routed_experts) for a, b in zip(again, fresh))
    third = engine.generate(reqs(n=2, record=True))  # now the cache carries routing: hits
    assert all(r.cached_tokens > 0 for r in third)
    assert all(torch.equal(a.routed_experts, b.routed_experts) for a, b in zip(third, fresh))


def test_no_hooks_and_no_routing_when_no_request_asks(model, both_kernels):
    seen = []
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    engine = EmbeddedEngine(model, EOS)
    results = engine.generate(reqs(n=3, record=False), on_token=lambda rid, t: seen.append(
        sum(len(r._forward_hooks) for r in routers)))
    assert seen and set(seen) == {0} and all(r.routed_experts is None for r in results)
    engine.generate(reqs(n=3, record=True), on_token=lambda rid, t: seen.append(
        sum(len(r._forward_hooks) for r in routers)))
    assert max(seen) == len(routers)  # recording calls hook every router ...
    assert sum(len(r._forward_hooks) for r in routers) == 0  # ... and remove the hooks afterwards


def test_a_dense_model_refuses_to_record():
    torch.manual_seed(0)
    dense = AutoModelForCausalLM.from_config(tiny_dense_config()).eval()
    with pytest.raises(ValueError, match="no MoE router"):
        EmbeddedEngine(dense, EOS).generate(reqs(n=1))
