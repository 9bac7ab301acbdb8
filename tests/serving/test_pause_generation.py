"""SGLang's /pause_generation modes in the server's batcher over the real embedded engine: a weight update
while requests are paused in place or retracted, and the version of every token they report.

The update zeroes every weight, so the new version's logits are all 0 and every token it samples has logprob
exactly -log(vocab): a token attributed to the wrong version (one too early or too late) shows as a logprob
that does not match its span."""

from __future__ import annotations

import copy
import math
import threading

import pytest
import torch

from slime_ext.data.generation import version_spans, versions_from_spans
from slime_ext.engine.embedded import EmbeddedEngine
from slime_ext.serving.batcher import Batcher, token_versions
from tests.serving.test_serve_continuous import model, request, slow_steps, wait_until  # noqa: F401 - fixtures

TOKENS = 60


def zero_update(engine: EmbeddedEngine, batcher: Batcher) -> None:
    """What the server's weight routes do: the update inside `exclusive()`, then the new version."""
    with batcher.exclusive():
        engine.update_weights_from_tensor([(n, torch.zeros_like(p)) for n, p in engine.model.named_parameters()])
        batcher.set_weight_version("1")


def generated(engine: EmbeddedEngine) -> int:
    return engine.stats["generated_tokens"]


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_a_paused_request_goes_on_under_the_new_weights_and_reports_each_tokens_version(model, slow_steps, mode):
    engine = EmbeddedEngine(copy.deepcopy(model), -1)  # no EOS: the request runs to its limit
    vocab = engine.model.config.vocab_size
    batcher = Batcher(engine, max_batch=8, window_s=0.001, weight_version="0")
    try:
        ticket = batcher.submit(request("r", TOKENS, 3))
        wait_until(lambda: generated(engine) >= 10)
        assert batcher.pause(mode) == 1
        updater = threading.Thread(target=zero_update, args=(engine, batcher))
        updater.start()
        updater.join(timeout=30)
        assert not updater.is_alive(), "the update waited for the paused request"
        assert not ticket.future.done()  # paused, not answered
        batcher.resume()
        result = ticket.future.result(timeout=60)
    finally:
        batcher.close()
    assert len(result.output_ids) == TOKENS and result.finish_reason == "length"
    versions = result.token_versions
    cut = versions.index("1")
    assert 10 <= cut < TOKENS and versions == ["0"] * cut + ["1"] * (TOKENS - cut)
    uniform = -math.log(vocab)
    assert all(lp == pytest.approx(uniform, abs=1e-5) for lp in result.logprobs[cut:])
    assert not any(lp == pytest.approx(uniform, abs=1e-5) for lp in result.logprobs[:cut])
    # the tokens before the cut are the old weights' (the same seed's reference run under them)
    reference = EmbeddedEngine(model, -1).generate([request("r", TOKENS, 3)])[0]
    assert result.output_ids[:cut] == reference.output_ids[:cut]
    assert ticket.weight_version == "1" and batcher.calls == (1 if mode == "in_place" else 2)


def test_abort_mode_answers_with_what_was_generated_and_holds_new_requests(model, slow_steps):
    engine = EmbeddedEngine(copy.deepcopy(model), -1)
    batcher = Batcher(engine, max_batch=8, window_s=0.001, weight_version="0")
    try:
        first = batcher.submit(request("a", TOKENS, 1))
        wait_until(lambda: generated(engine) >= 5)
        assert batcher.pause("abort") == 1
        cut = first.future.result(timeout=30)
        later = batcher.submit(request("b", 5, 2))
        with pytest.raises(TimeoutError):
            later.future.result(timeout=0.3)  # held while paused
        batcher.resume()
        assert len(later.future.result(timeout=30).output_ids) == 5
    finally:
        batcher.close()
    assert cut.finish_reason == "abort" and 5 <= len(cut.output_ids) < TOKENS
    assert cut.token_versions == ["0"] * len(cut.output_ids)


def test_in_place_needs_continuous_batching_and_modes_are_sglangs(model):
    batcher = Batcher(EmbeddedEngine(model, -1), continuous=False)
    try:
        with pytest.raises(ValueError, match="'in_place' needs continuous batching"):
            batcher.pause("in_place")
        with pytest.raises(ValueError, match=r"pause mode 'soft': expected one of \['abort', 'retract', 'in_place'\]"):
            batcher.pause("soft")
    finally:
        batcher.close()


def test_version_spans_round_trip_and_the_event_rule():
    assert token_versions([("0", 3), ("1", 5)], "2", 7) == ["0"] * 3 + ["1"] * 2 + ["2"] * 2
    assert token_versions([("0", 9)], "1", 4) == ["0"] * 4  # a change after the last token: all old
    per_token = ["3"] * 2 + ["4"] * 3
    spans = version_spans(per_token)
    assert spans == [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 5}]
    assert versions_from_spans(spans, 5, "r") == per_token
    with pytest.raises(ValueError, match="spans cover 5 tokens of 6"):
        versions_from_spans(spans, 6, "r")
    with pytest.raises(ValueError, match="do not tile the output"):
        versions_from_spans([{"version": "3", "start": 1, "end": 2}], 1, "r")


def test_the_routes_and_the_client_speak_sglangs_pause_and_version_spans(tmp_path_factory):
    """/pause_generation and /continue_generation as SGLang answers them (a bad mode is a 400 naming it), the
    client's calls validated against SGLang's io_struct, and `meta_info.weight_versions` spans on /generate read
    back by the client as one version per token."""
    from slime_ext.engine.sglang_client import SGLangEngineClient
    from tests.serving.test_serve_weights import _checkpoint, call, in_process

    model_dir = _checkpoint(tmp_path_factory.mktemp("pause"), seed=0)
    with in_process(model_dir, weight_version="v0") as (srv, state):
        url = srv.url
        code, body = call(url, "/pause_generation", {"mode": "soft"})
        assert code == 400 and body["error"]["param"] == "mode"
        assert call(url, "/pause_generation", {"mode": "retract"}) == (
            200, {"message": "Generation paused successfully.", "status": "ok", "requests": 0})
        assert state.batcher.paused == "retract"
        assert call(url, "/continue_generation", {}) == (
            200, {"message": "Generation continued successfully.", "status": "ok"})
        assert state.batcher.paused is None
        client = SGLangEngineClient(url, validate=True)
        assert client.pause_generation("in_place") == 0 and state.batcher.paused == "in_place"
        client.continue_generation()
        code, body = call(url, "/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}})
        assert code == 200 and body["meta_info"]["weight_versions"] == [{"version": "v0", "start": 0, "end": 2}]
        result = client._parse(request("r", 2, 1), {
            "output_ids": [3, 4, 5], "meta_info": {
                "finish_reason": {"type": "length", "length": 3}, "weight_version": "8",
                "output_token_logprobs": [[-1.0, 3, None], [-1.0, 4, None], [-1.0, 5, None]],
                "weight_versions": [{"version": "7", "start": 0, "end": 1}, {"version": "8", "start": 1, "end": 3}]}})
        assert result.token_versions == ["7", "8", "8"] and result.weight_version == "8"


def test_prefill_only_scoring_answers_as_sglang_and_equals_the_engines_own(tmp_path_factory):
    """SGLang's scoring request (max_new_tokens 0, return_logprob, logprob_start_len; on-policy distillation's
    teacher): input_token_logprobs from the start, the first None, equal to the engine's own scoring; the client's
    batch payload passes SGLang's io_struct; generation with logprob_start_len is refused naming the field."""
    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.engine.sglang_client import SGLangEngineClient
    from tests.serving.test_serve_weights import _checkpoint, call, in_process

    model_dir = _checkpoint(tmp_path_factory.mktemp("score"), seed=0)
    seqs, starts = [[5, 6, 7, 8, 9, 10], [11, 12, 13]], [3, 1]
    reference = EmbeddedEngine.from_pretrained(str(model_dir)).score(seqs, starts, "policy")
    with in_process(model_dir) as (srv, state):
        code, body = call(srv.url, "/generate", {"input_ids": seqs[0], "sampling_params": {"max_new_tokens": 0},
                                                 "return_logprob": True, "logprob_start_len": 2})
        assert code == 200 and body["output_ids"] == []
        triples = body["meta_info"]["input_token_logprobs"]
        assert [t[1] for t in triples] == [7, 8, 9, 10] and triples[0][0] is None
        assert [t[0] for t in triples[1:]] == pytest.approx(reference[0], abs=1e-6)
        got = SGLangEngineClient(srv.url, validate=True).score(seqs, starts)
        assert [len(g) for g in got] == [3, 2]
        for g, r in zip(got, reference):
            assert g == pytest.approx(r, abs=1e-6)
        code, body = call(srv.url, "/generate", {"input_ids": seqs[0], "sampling_params": {"max_new_tokens": 2},
                                                 "return_logprob": True, "logprob_start_len": 2})
        assert code == 400 and body["error"]["param"] == "logprob_start_len"
