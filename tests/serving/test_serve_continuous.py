"""Continuous batching in the server's batcher over the real embedded engine (issue 28, item 7): requests
that arrive while a call runs join it and leave when they finish; a weight update stops admission."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from sglang_patches.decoding import SamplingParams
from slime_ext.data.generation import GenerateRequest
from slime_ext.engine import static_kv
from slime_ext.engine.embedded import EmbeddedEngine
from slime_ext.serving.batcher import Batcher
from tests.engine.test_embedded import make_model

STEP_S = 0.004  # each decode step is slowed to this, so arrivals land mid-call on any machine


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return make_model(0)


@pytest.fixture
def slow_steps(monkeypatch):
    original = static_kv.StaticKVState.step

    def step(self, tokens):
        time.sleep(STEP_S)
        return original(self, tokens)

    monkeypatch.setattr(static_kv.StaticKVState, "step", step)


def request(rid: str, tokens: int, seed: int) -> GenerateRequest:
    return GenerateRequest(rid, [5, 6, 7, 8], SamplingParams(temperature=1.0, max_new_tokens=tokens), seed=seed)


def wait_until(predicate, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.002)


def started(engine: EmbeddedEngine) -> bool:
    return engine.stats["generated_tokens"] > 0


@pytest.mark.parametrize("continuous", [True, False])
def test_short_requests_join_a_running_call_and_finish_first(model, slow_steps, continuous):
    engine = EmbeddedEngine(model, -1)  # no EOS: every request runs to its token limit
    batcher = Batcher(engine, max_batch=16, window_s=0.001, continuous=continuous)
    try:
        long = batcher.submit(request("long", 300, 1))
        wait_until(lambda: started(engine))
        shorts = [batcher.submit(request(f"s{i}", 5, 10 + i)) for i in range(3)]
        short_results = [t.future.result(timeout=60) for t in shorts]
        long_done_when_shorts_done = long.future.done()
        long_result = long.future.result(timeout=60)
    finally:
        batcher.close()
    if continuous:  # one call: the shorts joined it and were answered while the long request still ran
        assert batcher.calls == 1 and batcher.admissions == 3
        assert not long_done_when_shorts_done
    else:  # the shorts waited for the long request's call to end, then ran in a second call
        assert batcher.calls == 2 and batcher.admissions == 0
        assert long_done_when_shorts_done
    assert len(long_result.output_ids) == 300
    for t, res in zip(shorts, short_results):
        assert res.rid == t.request.rid
        assert res.output_ids == EmbeddedEngine(model, -1).generate([t.request])[0].output_ids


def test_a_waiting_weight_update_stops_admission_and_later_requests_see_the_new_version(model, slow_steps):
    engine = EmbeddedEngine(model, -1)
    batcher = Batcher(engine, max_batch=16, window_s=0.001)
    events: list[str] = []
    try:
        long = batcher.submit(request("long", 150, 1))
        wait_until(lambda: started(engine))

        def update() -> None:
            with batcher.exclusive():
                events.append("update")
                batcher.weight_version = "v2"

        updater = threading.Thread(target=update)
        updater.start()
        wait_until(lambda: batcher._exclusive_pending == 1)
        late = batcher.submit(request("late", 4, 2))
        result = late.future.result(timeout=60)
        updater.join(timeout=60)
        events.append("late done")
    finally:
        batcher.close()
    assert long.future.result().finish_reason == "length" and long.weight_version != "v2"
    assert events == ["update", "late done"]
    assert late.weight_version == "v2" and len(result.output_ids) == 4
    assert batcher.calls == 2 and batcher.admissions == 0


def test_a_request_aborted_after_joining_stops_and_the_others_go_on(model, slow_steps):
    engine = EmbeddedEngine(model, -1)
    batcher = Batcher(engine, max_batch=16, window_s=0.001)
    try:
        long = batcher.submit(request("long", 200, 1))
        wait_until(lambda: started(engine))
        joined = batcher.submit(request("joined", 200, 2))
        wait_until(lambda: batcher.admissions == 1)
        assert batcher.abort("joined") == 1
        aborted = joined.future.result(timeout=60)
        again = batcher.submit(request("joined", 3, 3))  # the same rid sent again is not aborted
        assert len(again.future.result(timeout=60).output_ids) == 3
        assert len(long.future.result(timeout=60).output_ids) == 200
    finally:
        batcher.close()
    assert aborted.finish_reason == "abort" and len(aborted.output_ids) < 200
    assert batcher.calls == 1
