"""`SGLangEngineClient` batching (`sglang.generate_batching`): several requests per /generate call in SGLang's
batch form, with the same results and the same per-request guarantees (retries, aborts, failures) as one
request per call. Against the fake SGLang server of test_sglang_client (rows split as SGLang splits them)."""

from __future__ import annotations

import threading
import time

import pytest

from tests.engine.test_sglang_client import FakeSGLang, client_for, fake, req  # noqa: F401  (fixture)

PROMPTS = ([2, 4, 6], [3, 5])


def _requests(tag: str = "b") -> list:
    """Two prompt groups of three samples, interleaved (the pool hands requests in any order)."""
    return [req(f"{tag}{k}-{j}", PROMPTS[k], seed=10 * k + j) for j in range(3) for k in range(2)]


def _summary(results) -> list[tuple]:
    return [(r.rid, r.output_ids, r.logprobs, r.finish_reason) for r in results]


@pytest.mark.parametrize("mode,calls,sizes", [("request", 6, []), ("group", 2, [3, 3]), ("call", 1, [6])])
def test_every_batching_gives_the_same_results_in_fewer_calls(fake, mode, calls, sizes):
    reference = client_for(fake).generate(_requests())
    fake.log.clear()
    fake.batch_sizes.clear()
    client = client_for(fake, batching=mode)
    results = client.generate(_requests())
    assert _summary(results) == _summary(reference)
    assert sum(p == "/generate" for p in fake.paths()) == calls
    assert fake.batch_sizes == sizes
    assert client.stats["requests"] == 6 and client.stats["generated_tokens"] == sum(len(r.output_ids) for r in results)


def test_call_batches_are_cut_at_max_batch(fake):
    client = client_for(fake, batching="call", max_batch=4)
    client.generate(_requests())
    assert sorted(fake.batch_sizes) == [2, 4]  # the two calls run concurrently


def test_a_5xx_batch_is_retried_whole_with_fresh_wire_rids(fake):
    fake.status_plan["b1-0"] = [503]
    client = client_for(fake, batching="group")
    results = client.generate(_requests())
    assert _summary(results) == _summary(client_for(fake).generate(_requests()))
    assert client.stats["retries"] == 1 and client.stats["failed"] == 0
    bodies = [b for p, b in fake.log if p == "/generate" and b["input_ids"] and b["input_ids"][0] == PROMPTS[1]]
    assert [b["rid"] for b in bodies] == [["b1-0", "b1-1", "b1-2"], ["b1-0#retry1", "b1-1#retry1", "b1-2#retry1"]]


def test_a_refused_batch_is_sent_again_one_request_per_call(fake):
    fake.status_plan["b0-1"] = [400]  # the whole first group's batch is refused once
    client = client_for(fake, batching="group")
    results = client.generate(_requests())
    assert all(r.finish_reason in ("length", "stop") for r in results)
    assert client.stats["requests"] == 6 and client.stats["failed"] == 0  # each request counted once
    assert fake.batch_sizes == [3]  # the second group's batch; the refused one was not run
    assert client.batching == "group"  # a 400 concerns this batch only


def test_a_server_without_batches_turns_batching_off(fake):
    fake.refuse_batches = True
    client = client_for(fake, batching="call")
    first = client.generate(_requests())
    assert client.batching == "request"
    fake.log.clear()
    second = client.generate(_requests("c"))
    assert sum(p == "/generate" for p in fake.paths()) == 6  # one request per call from then on
    assert all(r.finish_reason in ("length", "stop") for r in first + second)


def test_an_invalid_request_fails_alone_in_its_batch(fake, monkeypatch):
    from sglang_patches.decoding import SamplingParams

    reference = client_for(fake).generate(_requests())
    fake.batch_sizes.clear()
    orig = SamplingParams.to_sglang
    requests = _requests()
    requests[2].sampling = SamplingParams(max_new_tokens=6, temperature=0.7)  # b0-1: marked by its temperature
    monkeypatch.setattr(SamplingParams, "to_sglang", lambda self: {**orig(self), **(
        {"max_tokens": 4} if self.temperature == 0.7 else {})})  # a key SGLang's SamplingParams refuses
    client = client_for(fake, batching="group")
    results = client.generate(requests)
    assert results[2].finish_reason == "failed" and "max_tokens" in results[2].error
    assert [s for i, s in enumerate(_summary(results)) if i != 2] == \
        [s for i, s in enumerate(_summary(reference)) if i != 2]
    assert sorted(fake.batch_sizes) == [2, 3] and client.stats["failed"] == 1


def test_abort_of_one_request_in_a_batch(fake):
    requests = [req(f"a{j}", [2, 4, 6], seed=j, max_new_tokens=20) for j in range(3)]
    for r in requests:
        fake.abort_events[r.rid] = threading.Event()  # rows then take 50 ms per token
    client = client_for(fake, batching="group")
    threading.Timer(0.2, client.abort, args=("a1",)).start()
    start = time.perf_counter()
    results = client.generate(requests)
    assert results[1].finish_reason == "abort" and len(results[1].output_ids) < 20
    assert [results[0].finish_reason, results[2].finish_reason] != ["abort", "abort"]
    assert len(results[0].output_ids) > len(results[1].output_ids) or results[0].finish_reason == "stop"
    assert time.perf_counter() - start < 10


def test_batching_is_checked():
    from slime_ext.engine.sglang_client import SGLangEngineClient

    with pytest.raises(ValueError, match="batching must be one of"):
        SGLangEngineClient("http://127.0.0.1:1", batching="prompt")


def test_the_config_key_reaches_every_engine_client_and_the_router_gets_single_requests(tmp_path):
    from slime_ext.config.sections import SGLangConfig
    from slime_ext.engine.server_pool import ServerEnginePool

    assert SGLangConfig().generate_batching == "group"
    pool = ServerEnginePool([object(), object()], ["http://127.0.0.1:1", "http://127.0.0.1:2"],
                            SGLangConfig(generate_batching="call"), str(tmp_path), router_url="http://127.0.0.1:3")
    assert [c.batching for c in pool.clients] == ["call", "call"] and pool.router.batching == "request"
