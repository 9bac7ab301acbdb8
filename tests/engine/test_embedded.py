"""The embedded engine: determinism, batching invariance, logprobs, prefix reuse, abort, weight updates."""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

import pytest
import torch
from transformers import AutoModelForCausalLM

from sglang_patches.request_sampler import RequestView, Sampler, StepAction, register_sampler
from sglang_patches.decoding import SamplingParams
from slime_ext.data.generation import GenerateRequest
from slime_ext.engine.embedded import EmbeddedEngine
from tests.megatron_fixtures import tiny_dense_config, tiny_moe_config

EOS = 1


def make_model(seed: int = 0, moe: bool = True):
    """Random tiny model with a large init so its next-token distributions are far from uniform (with
    the default 0.02 init every model samples almost the same tokens from the same seed)."""
    torch.manual_seed(seed)
    cfg = tiny_moe_config(initializer_range=0.5) if moe else tiny_dense_config(initializer_range=0.5)
    return AutoModelForCausalLM.from_config(cfg).eval()


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return make_model(0)


def requests(sp: SamplingParams, n: int = 6, base_seed: int = 0) -> list[GenerateRequest]:
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [18], [20, 21, 22, 23, 24], [25, 26, 27]]
    return [GenerateRequest(f"r{i}", prompts[i % len(prompts)], sp, seed=base_seed + i) for i in range(n)]


def full_forward_logprobs(model, prompt, output):
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
    return [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(output)]


def test_same_seed_same_output_and_different_seed_differs(model, both_kernels):
    sp = SamplingParams(temperature=1.0, max_new_tokens=16)
    a = EmbeddedEngine(model, EOS).generate(requests(sp))
    b = EmbeddedEngine(model, EOS).generate(requests(sp))
    c = EmbeddedEngine(model, EOS).generate(requests(sp, base_seed=100))
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    assert [r.output_ids for r in a] != [r.output_ids for r in c]


def test_mixed_length_batch_equals_one_by_one_and_logprobs_match_forward(model, both_kernels):
    sp = SamplingParams(temperature=1.0, top_p=0.95, top_k=40, max_new_tokens=20)
    engine = EmbeddedEngine(model, EOS)
    batched = engine.generate(requests(sp))
    for req, res in zip(requests(sp), batched):
        alone = EmbeddedEngine(model, EOS).generate([req])[0]
        assert alone.output_ids == res.output_ids, req.rid
        expected = full_forward_logprobs(model, req.input_ids, res.output_ids)
        assert max(abs(x - y) for x, y in zip(expected, res.logprobs)) < 1e-4
        assert res.prompt_len == len(req.input_ids) and len(res.annotations) == len(res.output_ids)


def test_group_prompt_is_prefilled_once_and_finished_rows_leave(model, monkeypatch, both_kernels):
    kernel = both_kernels
    sp = SamplingParams(temperature=1.0, max_new_tokens=10)
    prompt = [5, 6, 7, 8, 9, 10]
    group = [GenerateRequest(f"g{i}", prompt, sp, seed=i) for i in range(8)]
    engine = EmbeddedEngine(model, -1)  # no EOS: rows end only by their token limits
    widths = []
    from slime_ext.engine import embedded, static_kv

    state_class = static_kv.StaticKVState if kernel == "static" else embedded._ModelState
    original = state_class.step

    def spy(self, tokens):
        widths.append(tokens.shape[0])
        return original(self, tokens)

    monkeypatch.setattr(state_class, "step", spy)
    # two requests stop early through their own stop id: the batch shrinks to 6 rows after that step
    early = [GenerateRequest("short0", [30, 31], SamplingParams(temperature=0.0, max_new_tokens=3), seed=0),
             GenerateRequest("short1", [32, 33], SamplingParams(temperature=0.0, max_new_tokens=2), seed=0)]
    results = engine.generate(group + early)
    assert engine.stats["prefill_tokens"] == len(prompt) + 4  # the shared prompt once, plus the two short ones
    assert len({tuple(r.output_ids) for r in results[:8]}) > 1  # different seeds, different samples
    assert widths[0] == 10 and widths[1] == 9 and widths[2] == 8 and widths[-1] == 8


def test_continuation_reuses_the_prefix_and_equals_generation_from_scratch(model, both_kernels):
    sp = SamplingParams(temperature=1.0, max_new_tokens=12)
    engine = EmbeddedEngine(model, EOS)
    first = engine.generate([GenerateRequest("a", [5, 6, 7, 8], sp, seed=3)])[0]
    appended = [40, 41, 42]
    cont_ids = [5, 6, 7, 8] + first.output_ids[:6] + appended
    cont = engine.generate([GenerateRequest("b", cont_ids, sp, seed=9)])[0]
    assert cont.cached_tokens == len(cont_ids) - len(appended)  # prompt + partial response come from the cache
    scratch = EmbeddedEngine(model, EOS).generate([GenerateRequest("b", cont_ids, sp, seed=9)])[0]
    assert scratch.cached_tokens == 0
    assert cont.output_ids == scratch.output_ids
    assert max(abs(x - y) for x, y in zip(cont.logprobs, scratch.logprobs)) < 1e-4
    assert engine.metrics()["prefix_cache_hit_rate"] > 0


@register_sampler
class AbortOtherAtStep(Sampler):
    """Test sampler: at step `at` asks the engine (looked up in ENGINES) to abort request `target`."""

    kind = "test_abort_other"
    ENGINES: dict[str, Any] = {}

    def __init__(self, seed: int, target: str, at: int, engine: str):
        super().__init__(seed)
        self.target, self.at, self.engine = target, at, engine

    def adjust(self, logits, partner_logits, view: RequestView) -> StepAction:
        if view.step == self.at:
            self.ENGINES[self.engine].abort(self.target)
        return StepAction()


def test_abort_stops_only_the_named_request(model, both_kernels):
    sp = SamplingParams(temperature=1.0, max_new_tokens=15)
    reference = EmbeddedEngine(model, -1).generate(requests(sp, 4))
    engine = EmbeddedEngine(model, -1)
    AbortOtherAtStep.ENGINES["e"] = engine
    reqs = requests(sp, 4)
    reqs[0].sampler_specs = [{"kind": "test_abort_other", "target": "r2", "at": 4, "engine": "e"}]
    results = engine.generate(reqs)
    # the abort lands while step 4 is being decided, so r2 keeps its step-4 token and stops after it
    assert results[2].finish_reason == "abort" and len(results[2].output_ids) == 5
    assert results[2].output_ids == reference[2].output_ids[:5]
    for i in (0, 1, 3):
        assert results[i].output_ids == reference[i].output_ids and results[i].finish_reason == "length"
    assert engine.stats["aborted"] == 1


def test_abort_from_another_thread_while_generating(model, both_kernels):
    engine = EmbeddedEngine(model, -1)
    sp = SamplingParams(temperature=1.0, max_new_tokens=400)
    reqs = [GenerateRequest("long", [5, 6], sp, seed=0), GenerateRequest("other", [7, 8], SamplingParams(max_new_tokens=5), seed=1)]
    out = {}
    thread = threading.Thread(target=lambda: out.update(res=engine.generate(reqs)))
    thread.start()
    while engine.stats["generated_tokens"] < 20:
        time.sleep(0.005)
    engine.abort("long")
    thread.join(timeout=60)
    long, other = out["res"]
    assert long.finish_reason == "abort" and len(long.output_ids) < 400
    assert other.finish_reason == "length" and len(other.output_ids) == 5


@pytest.mark.parametrize("moe", [True, False])
def test_weight_update_equals_loading_the_new_weights(moe, both_kernels):
    from megatron_glue.weight_names import canonical_hf_state_dict

    old, new = make_model(0, moe), make_model(1, moe)
    sp = SamplingParams(temperature=1.0, max_new_tokens=12)
    engine = EmbeddedEngine(old, EOS)
    before = engine.generate(requests(sp, 3))
    canonical = canonical_hf_state_dict(new.state_dict(), new.config)
    engine.update_weights_from_tensor(list(canonical.items()))
    assert len(engine.prefix_cache) == 0  # flushed: cached KV came from the old weights
    after = engine.generate(requests(sp, 3))
    expected = EmbeddedEngine(make_model(1, moe), EOS).generate(requests(sp, 3))
    assert [r.output_ids for r in after] == [r.output_ids for r in expected]
    assert [r.output_ids for r in after] != [r.output_ids for r in before]
    with pytest.raises(KeyError, match="matches no parameter"):
        engine.update_weights_from_tensor([("model.nope.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="has shape"):
        engine.update_weights_from_tensor([("model.norm.weight", torch.zeros(3))])


@register_sampler
class FollowPartner(Sampler):
    """Test sampler: take the partner's logits on even steps (a miniature of Tandem's handoff)."""

    kind = "test_follow_partner"
    needs_partner = True

    def adjust(self, logits, partner_logits, view):
        return StepAction(logits=partner_logits if view.step % 2 == 0 else logits)

    def on_token(self, token_id, view):
        return {"author": 0 if view.step % 2 == 0 else 1}


def test_partner_model_runs_in_lockstep(both_kernels):
    policy, partner = make_model(0), make_model(5)
    sp = SamplingParams(temperature=0.0, max_new_tokens=10)
    engine = EmbeddedEngine(policy, -1, partner=partner)
    prompt = [5, 6, 7]
    res = engine.generate([GenerateRequest("t", prompt, sp, seed=0, sampler_specs=[{"kind": "test_follow_partner"}])])[0]
    # reference: greedy by hand, alternating which model's argmax is taken, both fed every token
    ids = list(prompt)
    for step in range(10):
        with torch.no_grad():
            chooser = partner if step % 2 == 0 else policy
            ids.append(int(chooser(torch.tensor([ids])).logits[0, -1].argmax()))
    assert res.output_ids == ids[len(prompt):]
    assert [a["author"] for a in res.annotations] == [0, 1] * 5
    with pytest.raises(ValueError, match="needs a partner"):
        EmbeddedEngine(policy, -1).generate([GenerateRequest("t", prompt, sp, seed=0, sampler_specs=[{"kind": "test_follow_partner"}])])


def test_request_errors(model, both_kernels):
    engine = EmbeddedEngine(model, EOS)
    sp = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match="unique"):
        engine.generate([GenerateRequest("x", [5], sp, 0), GenerateRequest("x", [6], sp, 0)])
    with pytest.raises(ValueError, match="no input ids"):
        engine.generate([GenerateRequest("x", [], sp, 0)])
    with pytest.raises(ValueError, match="unknown sampler kind"):
        engine.generate([GenerateRequest("x", [5], sp, 0, sampler_specs=[{"kind": "nope"}])])


def test_engine_runs_inside_a_ray_actor(model, tmp_path):
    import ray

    model.save_pretrained(tmp_path / "m")
    from slime_ext.tokenizer import train_tokenizer

    train_tokenizer(["a b c 1 2 3"] * 50, vocab_size=280, out_dir=tmp_path / "m")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        actor = ray.remote(EmbeddedEngine).options(max_concurrency=2).remote(
            AutoModelForCausalLM.from_pretrained(tmp_path / "m"), EOS)
        sp = SamplingParams(temperature=1.0, max_new_tokens=6)
        remote = ray.get(actor.generate.remote(requests(sp, 2)))
        local = EmbeddedEngine(model, EOS).generate(requests(sp, 2))
        assert [r.output_ids for r in remote] == [r.output_ids for r in local]
    finally:
        ray.shutdown()
