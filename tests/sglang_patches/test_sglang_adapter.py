"""Contract tests: our samplers hosted inside SGLang's CustomLogitProcessor (the real sglang class).

SGLang's calling code is exercised too: `apply_custom_logit_processor` is taken from sglang's own
`srt/layers/sampler.py` source (the module does not import on CPU) and run on CPU logits.
"""

from __future__ import annotations

import ast
import gc
import importlib.util
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest
import torch

try:
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor
    from sglang.srt.sampling.sampling_params import SamplingParams as SGLangSamplingParams
except Exception as exc:  # noqa: BLE001
    print(f"sglang not importable: {exc}")
    pytest.skip(f"sglang not importable: {exc}", allow_module_level=True)

from sglang_patches import sglang_adapter as adapter
from sglang_patches.request_sampler import (
    SAMPLER_REGISTRY, CoinStream, RequestView, Sampler, SamplerChain, StepAction, register_sampler,
    replay_annotations,
)
from sglang_patches.decoding import SamplingParams, choose_token
from sglang_patches.sglang_adapter import SamplerHostError, SamplerLogitProcessor

NEG = -math.inf
EOS = 1
VOCAB = 16


class ScriptedSampler(Sampler):
    """Test-only sampler: forces `force_token` at step `force_step`, bans `ban`, ends the request after
    `end_on` appears, nudges token 0 by 0.25 * (tokens seen) so `adjust` depends on caught-up state, and
    annotates a counter plus a coin drawn from its stream (state that advances only in on_token)."""

    kind = "test_sglang_scripted"

    def __init__(self, seed: int, force_step: int = 2, force_token: int = 5, ban: int = 3, end_on: int = 7):
        super().__init__(seed)
        self.force_step, self.force_token, self.ban, self.end_on = force_step, force_token, ban, end_on
        self.count = 0
        self.coins = CoinStream(seed, "scripted")

    def adjust(self, logits, partner_logits, view):
        if view.output_ids and view.output_ids[-1] == self.end_on:
            return StepAction(finish=True)
        if view.step == self.force_step:
            return StepAction(force_token=self.force_token)
        out = logits.clone()
        out[self.ban] = NEG
        out[0] = out[0] + 0.25 * self.count
        return StepAction(logits=out)

    def on_token(self, token_id, view):
        ann = {"count": self.count, "step": view.step, "coin": round(self.coins.uniform(), 12)}
        self.count += 1
        return ann


class PartnerSampler(Sampler):
    kind = "test_sglang_needs_partner"
    needs_partner = True


for _cls in (ScriptedSampler, PartnerSampler):
    if SAMPLER_REGISTRY.get(_cls.kind) is None:
        register_sampler(_cls)

SPECS = [{"kind": ScriptedSampler.kind}]


class FakeReq:
    """Stand-in for sglang's Req: what the processor reads."""

    def __init__(self, rid: str, prompt: list[int]):
        self.rid = rid
        self.origin_input_ids = list(prompt)
        self.output_ids: list[int] = []
        self.finished_reason: Optional[str] = None

    def finished(self) -> bool:
        return self.finished_reason is not None


def params_for(req: FakeReq, seed: int, specs=SPECS) -> dict[str, Any]:
    """custom_params as the scheduler holds them: ours plus SGLang's injected "__req__"."""
    return adapter.build_custom_params(specs, seed, EOS, req.rid) | {"__req__": req}


@pytest.fixture(autouse=True)
def _fresh_registry():
    adapter.clear_registry()
    yield
    adapter.clear_registry()


# -- sglang's own calling code ---------------------------------------------------------------------
def _sglang_apply_fn():
    spec = importlib.util.find_spec("sglang")
    path = Path(list(spec.submodule_search_locations)[0]) / "srt/layers/sampler.py"
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "apply_custom_logit_processor")
    ns: dict[str, Any] = {"torch": torch, "logger": SimpleNamespace(debug=lambda *a, **k: None),
                          "SamplingBatchInfo": object}
    exec(compile(ast.Module([fn], []), str(path), "exec"), ns)  # noqa: S102 - sglang's own function
    return ns["apply_custom_logit_processor"]


class FakeBatchInfo:
    """The SamplingBatchInfo fields apply_custom_logit_processor reads, built the way
    SamplingBatchInfo.from_schedule_batch builds them (one entry per distinct processor string)."""

    def __init__(self, processor_strs: list[Optional[str]], custom_params: list[Optional[dict]]):
        self.device = "cpu"
        self.custom_params = custom_params
        groups: dict[str, list[int]] = {}
        for i, s in enumerate(processor_strs):
            if s is not None:
                groups.setdefault(s, []).append(i)
        self.custom_logit_processor = {
            hash(s): SimpleNamespace(processor=CustomLogitProcessor.from_str(s), rows=rows,
                                     indices=torch.tensor(rows, dtype=torch.long))
            for s, rows in groups.items()
        }

    def __len__(self) -> int:
        return len(self.custom_params)


# -- contract ------------------------------------------------------------------------------------
def test_subclasses_real_base_and_round_trips_through_to_str():
    assert issubclass(SamplerLogitProcessor, CustomLogitProcessor)
    s = SamplerLogitProcessor.to_str()
    blob = bytes.fromhex(json.loads(s)["callable"])
    # pickled by reference (module + name), so the server imports this module; no code travels
    assert b"sglang_patches.sglang_adapter" in blob and b"SamplerLogitProcessor" in blob and len(blob) < 200
    restored = CustomLogitProcessor.from_str(s)
    assert type(restored) is SamplerLogitProcessor
    assert SamplerLogitProcessor().to_str() == s  # stable: SGLang groups rows by this string


def test_custom_params_survive_sglang_sampling_params_and_msgpack_ipc():
    import msgspec

    cp = adapter.build_custom_params(SPECS, 11, EOS, "r1", tokenizer_path="/tok")
    sp = SGLangSamplingParams(custom_params=cp, sampling_seed=11)
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(sp), type=SGLangSamplingParams)
    assert back.custom_params == cp
    assert adapter.decode_specs(back.custom_params["sampler_specs"]) == SPECS
    assert back.custom_params["sampler_modules"] == [__name__]
    # nested specs (a list of dicts) would not survive the typed IPC: that is why they travel as JSON
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(msgspec.msgpack.encode(SGLangSamplingParams(custom_params={"s": SPECS})),
                               type=SGLangSamplingParams)


def test_exact_rows_force_ban_finish_and_passthrough():
    apply = _sglang_apply_fn()
    proc = SamplerLogitProcessor.to_str()
    a, b, c = FakeReq("a", [9, 9]), FakeReq("b", [8]), FakeReq("c", [7])
    a.output_ids = [2, 4]  # step 2: force 5
    c.output_ids = [6, 7]  # last token is end_on: finish -> EOS
    base = torch.arange(4 * 8, dtype=torch.float32).reshape(4, 8) / 10
    logits = base.clone()
    # row 2 has no processor, row 3 has the processor but no sampler params
    info = FakeBatchInfo([proc, proc, None, proc],
                         [params_for(a, 1), params_for(b, 2), None, {"thinking_budget": 3, "__req__": FakeReq("d", [])}])
    # b at step 0 has seen no tokens: ban 3, token 0 + 0
    apply(logits, info)
    one_hot_5 = torch.full((8,), NEG)
    one_hot_5[5] = 0.0
    assert torch.equal(logits[0], one_hot_5)
    expect_b = base[1].clone()
    expect_b[3] = NEG
    assert torch.equal(logits[1], expect_b)
    assert torch.equal(logits[2], base[2])
    assert torch.equal(logits[3], base[3])
    # request c: its chain catches up on [6, 7] (count 2) and then ends it: EOS is the only choice
    logits2 = base[:1].clone()
    apply(logits2, FakeBatchInfo([proc], [params_for(c, 3)]))
    one_hot_eos = torch.full((8,), NEG)
    one_hot_eos[EOS] = 0.0
    assert torch.equal(logits2[0], one_hot_eos)
    assert adapter.finish_requested("c") is True and adapter.finish_requested("a") is False
    # b, one step later, has seen one token: token 0 is nudged by 0.25
    b.output_ids.append(6)
    logits3 = base[1:2].clone()
    apply(logits3, FakeBatchInfo([proc], [params_for(b, 2)]))
    expect_b2 = base[1].clone()
    expect_b2[3] = NEG
    expect_b2[0] += 0.25
    assert torch.equal(logits3[0], expect_b2)
    anns = adapter.annotations_for("a", [2, 4, 5])
    assert [x["count"] for x in anns] == [0, 1, 2] and [x["step"] for x in anns] == [0, 1, 2]


# -- the same sampler in two hosts ----------------------------------------------------------------
def step_logits(n_steps: int, seed: int, no_eos: bool = False) -> torch.Tensor:
    logits = torch.randn(n_steps, VOCAB, generator=torch.Generator().manual_seed(seed)) * 2.0
    if no_eos:  # the model never ends on its own (runs of a fixed length)
        logits[:, EOS] = NEG
    return logits


def step_generator(seed: int, step: int) -> torch.Generator:
    # per-position draws, like SGLang's seeded sampling: a forced step (no draw in the host loop, a
    # draw from a one-hot row in SGLang) cannot shift later draws
    return torch.Generator().manual_seed(seed * 100003 + step)


SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=40)


def run_host_loop(seed: int, prompt: list[int], logits: torch.Tensor, specs=SPECS, rid: str = "r"):
    """The embedded engine's decision loop: adjust, choose (or take the forced token), annotate."""
    chain = SamplerChain.from_specs(specs, seed)
    out: list[int] = []
    anns, rows = [], []
    for step in range(logits.shape[0]):
        view = RequestView(rid, seed, prompt, out, EOS, None)
        action = chain.adjust(logits[step].clone(), None, view)
        rows.append(action)
        if action.force_token is not None:
            token = action.force_token
        else:
            token = choose_token(action.logits, SAMPLING, step_generator(seed, step))
        anns.append(chain.on_token(token, view))
        out.append(token)
        if token == EOS:
            break
    return out, anns, chain, rows


def run_sglang_host(seed: int, prompt: list[int], logits: torch.Tensor, rid: str = "r", call_every: int = 1,
                    reference: Optional[list[int]] = None):
    """SGLang's side: processor over the batch row, then SGLang's choice on the processed row; the
    scheduler appends the token to req.output_ids before the next step. With call_every > 1 the
    processor only runs every k-th step (tokens come from `reference` in between)."""
    apply = _sglang_apply_fn()
    proc = SamplerLogitProcessor.to_str()
    req = FakeReq(rid, prompt)
    processed = {}
    for step in range(logits.shape[0]):
        if step % call_every == 0:
            row = logits[step : step + 1].clone()
            apply(row, FakeBatchInfo([proc], [params_for(req, seed)]))
            processed[step] = row[0]
            token = choose_token(row[0], SAMPLING, step_generator(seed, step))
        else:
            token = reference[step]
        if reference is not None:
            assert token == reference[step]
        req.output_ids.append(token)
        if token == EOS:
            break
    req.finished_reason = "stop"
    return req, processed


def test_same_sampler_two_hosts_identical_tokens_and_annotations():
    seed, prompt = 2, [11, 12, 13]
    logits = step_logits(40, seed=3)
    ref_out, ref_anns, _, _ = run_host_loop(seed, prompt, logits)
    req, _ = run_sglang_host(seed, prompt, logits)
    assert req.output_ids == ref_out
    # the scripted behaviour really happened: forced 5 at step 2, 3 never drawn, EOS right after a 7
    assert ref_out[2] == 5 and 3 not in ref_out
    assert 7 in ref_out and ref_out[ref_out.index(7) + 1] == EOS and ref_out[-1] == EOS
    assert len(ref_out) > 4
    hosted = adapter.annotations_for("r", req.output_ids)
    replayed = replay_annotations(SPECS, seed, prompt, req.output_ids, EOS, rid="r")
    assert hosted == ref_anns == replayed
    assert [a["count"] for a in hosted] == list(range(len(ref_out)))


def test_catch_up_when_called_every_fourth_step():
    seed, prompt = 4, [11, 12, 13]
    # a sampler that ends late so several catch-ups happen: end_on a token that never wins
    specs = [{"kind": ScriptedSampler.kind, "end_on": 99}]
    logits = step_logits(13, seed=5, no_eos=True)
    ref_out, ref_anns, ref_chain, ref_actions = run_host_loop(seed, prompt, logits, specs=specs)
    assert len(ref_out) == 13
    apply = _sglang_apply_fn()
    proc = SamplerLogitProcessor.to_str()
    req = FakeReq("r", prompt)
    for step in range(13):
        if step % 4 == 0:  # output_ids grew by 3 since the last call
            row = logits[step : step + 1].clone()
            apply(row, FakeBatchInfo([proc], [params_for(req, seed, specs)]))
            action = ref_actions[step]
            if action.force_token is not None:
                assert int(torch.argmax(row[0])) == action.force_token and torch.isinf(row[0]).sum() == VOCAB - 1
            else:
                assert torch.equal(row[0], action.logits)
            state = adapter._REGISTRY["r"]
            assert len(state.output_ids) == step  # caught up exactly
        req.output_ids.append(ref_out[step])
    assert adapter.annotations_for("r", req.output_ids) == ref_anns
    assert adapter._REGISTRY["r"].chain.state_dict() == ref_chain.state_dict()


def test_interleaved_requests_keep_separate_state():
    apply = _sglang_apply_fn()
    proc = SamplerLogitProcessor.to_str()
    specs_a = [{"kind": ScriptedSampler.kind, "end_on": 99}]
    specs_b = [{"kind": ScriptedSampler.kind, "end_on": 99, "force_step": 1, "force_token": 9, "ban": 2}]
    la, lb = step_logits(8, seed=1, no_eos=True), step_logits(8, seed=2, no_eos=True)
    ref_a = run_host_loop(10, [1, 2], la, specs_a, rid="A")
    ref_b = run_host_loop(20, [3], lb, specs_b, rid="B")
    assert len(ref_a[0]) == len(ref_b[0]) == 8
    ra, rb = FakeReq("A", [1, 2]), FakeReq("B", [3])
    for step in range(8):
        order = [(ra, 10, specs_a, la, ref_a), (rb, 20, specs_b, lb, ref_b)]
        if step % 2:
            order.reverse()  # batch position changes between steps
        batch = torch.stack([lg[step] for _, _, _, lg, _ in order])
        apply(batch, FakeBatchInfo([proc, proc], [params_for(r, s, sp) for r, s, sp, _, _ in order]))
        for i, (req, seed, _, _, ref) in enumerate(order):
            token = choose_token(batch[i], SAMPLING, step_generator(seed, step))
            assert token == ref[0][step]
            req.output_ids.append(token)
    assert ra.output_ids[2] == 5 and rb.output_ids[1] == 9 and 2 not in rb.output_ids
    assert adapter.annotations_for("A", ra.output_ids) == ref_a[1]
    assert adapter.annotations_for("B", rb.output_ids) == ref_b[1]
    assert ref_a[1] != ref_b[1]


# -- state handling ---------------------------------------------------------------------------------
def test_new_req_under_same_rid_starts_over_and_release():
    proc = SamplerLogitProcessor()
    first = FakeReq("x", [1])
    first.output_ids = [4, 6, 8]
    proc(torch.zeros(1, VOCAB), [params_for(first, 3)])
    assert len(adapter._REGISTRY["x"].output_ids) == 3
    retry = FakeReq("x", [1])  # e.g. the client re-sent the request
    out = proc(torch.zeros(1, VOCAB), [params_for(retry, 3)])
    assert len(adapter._REGISTRY["x"].output_ids) == 0
    assert out[0, 3] == NEG and out[0, 0] == 0.0  # step 0 again: no nudge, ban applied
    # a continuation under the same rid (new Req, new seed and prompt) at the same step: not the old state
    cont = FakeReq("x", [1, 4])
    proc(torch.zeros(1, VOCAB), [params_for(cont, 5)])
    state = adapter._REGISTRY["x"]
    assert state.seed == 5 and list(state.prompt_ids) == [1, 4]
    cont.output_ids = [6]
    assert adapter.annotations_for("x") == replay_annotations(SPECS, 5, [1, 4], [6], EOS, rid="x")
    assert adapter.release("x") and not adapter.release("x")
    assert adapter.annotations_for("x") is None


def test_registry_is_bounded_finished_first(monkeypatch):
    monkeypatch.setattr(adapter, "MAX_TRACKED_REQUESTS", 4)
    proc = SamplerLogitProcessor()
    reqs = [FakeReq(f"q{i}", [1]) for i in range(6)]
    for i, req in enumerate(reqs[:4]):
        proc(torch.zeros(1, VOCAB), [params_for(req, i)])
    reqs[1].finished_reason = "stop"
    proc(torch.zeros(1, VOCAB), [params_for(reqs[4], 4)])
    assert adapter.tracked_requests() == ["q0", "q2", "q3", "q4"]  # the finished one went first
    proc(torch.zeros(1, VOCAB), [params_for(reqs[5], 5)])
    assert adapter.tracked_requests() == ["q2", "q3", "q4", "q5"]  # then the oldest
    # a request whose Req object was freed is dropped by the periodic sweep
    monkeypatch.setattr(adapter, "SWEEP_EVERY", 1)
    del reqs[3], req  # (the loop variable held it too)
    gc.collect()
    proc(torch.zeros(1, VOCAB), [None])
    assert adapter.tracked_requests() == ["q2", "q4", "q5"]


def test_partner_sampler_rejected_with_its_name():
    req = FakeReq("p", [1])
    with pytest.raises(SamplerHostError, match=PartnerSampler.kind):
        SamplerLogitProcessor()(torch.zeros(1, VOCAB), [params_for(req, 0, [{"kind": PartnerSampler.kind}])])
    with pytest.raises(SamplerHostError, match="needs_partner"):
        adapter.check_hostable([{"kind": PartnerSampler.kind}])


def test_speculative_rows_and_missing_req_rejected():
    req = FakeReq("s", [1])
    p = params_for(req, 0)
    with pytest.raises(SamplerHostError, match="speculative"):
        SamplerLogitProcessor()(torch.zeros(2, VOCAB), [p, p])
    bare = adapter.build_custom_params(SPECS, 0, EOS, "s")
    with pytest.raises(SamplerHostError, match="__req__"):
        SamplerLogitProcessor()(torch.zeros(1, VOCAB), [bare])


def test_specs_as_list_and_rid_fallback():
    """A spec list (not JSON) is accepted, and a Req without rid uses the 'rid' custom param."""
    req = FakeReq("", [1])
    params = {"sampler_specs": SPECS, "seed": 0, "eos_token_id": EOS, "rid": "fallback", "__req__": req}
    out = SamplerLogitProcessor()(torch.zeros(1, VOCAB), [params])
    assert out[0, 3] == NEG
    assert adapter.tracked_requests() == ["fallback"]


class TailSampler(Sampler):
    kind = "test_sglang_tail"
    needs_decode = True

    def on_token(self, token_id, view):
        return {"tail": view.tail_text(2)}


if SAMPLER_REGISTRY.get(TailSampler.kind) is None:
    register_sampler(TailSampler)


def test_decoding_samplers_get_the_tokenizer_named_in_params(monkeypatch):
    loaded = []

    def fake_decoder_for(path):
        loaded.append(path)
        return lambda ids: "|".join(f"{path}:{i}" for i in ids)

    monkeypatch.setattr(adapter, "decoder_for", fake_decoder_for)
    specs = [{"kind": TailSampler.kind}]
    req = FakeReq("t", [1])
    with pytest.raises(SamplerHostError, match="tokenizer_path"):
        SamplerLogitProcessor()(torch.zeros(1, VOCAB), [params_for(req, 0, specs)])
    params = adapter.build_custom_params(specs, 0, EOS, "t", tokenizer_path="/tok") | {"__req__": req}
    req.output_ids = [4, 6]
    SamplerLogitProcessor()(torch.zeros(1, VOCAB), [params])
    assert loaded == ["/tok"]
    assert adapter.annotations_for("t") == [{"tail": ""}, {"tail": "/tok:4"}]  # the view excludes the token


def test_embedded_engine_and_sglang_processor_choose_the_same_tokens(monkeypatch):
    """The real embedded engine vs the SGLang processor fed the logits that engine saw, step by step.

    The engine draws one uniform per step from the request's generator (forced steps included), so the
    SGLang side here samples with one sequentially used generator seeded the same way."""
    from transformers import AutoModelForCausalLM

    from slime_ext.data.generation import GenerateRequest
    from slime_ext.engine.embedded import EmbeddedEngine
    from tests.megatron_fixtures import tiny_moe_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_moe_config(vocab_size=VOCAB, initializer_range=0.5)).eval()
    seen: list[torch.Tensor] = []
    original = EmbeddedEngine._decide

    def recording(self, rows, logits, partner_logits):
        seen.append(logits[0].clone())
        return original(self, rows, logits, partner_logits)

    monkeypatch.setattr(EmbeddedEngine, "_decide", recording)
    prompt = [11, 12, 13]
    for seed in range(50):  # the first seed (deterministic) whose rollout outlives the scripted force
        seen.clear()
        request = GenerateRequest(f"e{seed}", prompt, SAMPLING, seed=seed, sampler_specs=json.loads(json.dumps(SPECS)))
        result = EmbeddedEngine(model, EOS).generate([request])[0]
        if len(result.output_ids) >= 6:
            break
    assert len(result.output_ids) >= 6 and result.output_ids[2] == 5  # the scripted force happened

    apply = _sglang_apply_fn()
    proc = SamplerLogitProcessor.to_str()
    req = FakeReq(request.rid, prompt)
    generator = torch.Generator().manual_seed(seed)
    for logits in seen:
        row = logits[None].clone()
        apply(row, FakeBatchInfo([proc], [params_for(req, seed)]))
        req.output_ids.append(choose_token(row[0], SAMPLING, generator))
    assert req.output_ids == result.output_ids
    assert adapter.annotations_for(request.rid, req.output_ids) == result.annotations
