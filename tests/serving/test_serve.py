"""The OpenAI-compatible server over the embedded engine, and the clients that talk to it (OpenAIClient's
retries against a failing server: tests/clients/test_openai_client.py)."""

from __future__ import annotations

from typing import Any

import json
import urllib.error
import urllib.request

import pytest
import torch

from slime_ext.clients.openai_client import CallFailed, OpenAIClient
from slime_ext.tools.serve import ServerState, serve


def served_checkpoint(d, **config: Any):
    """A tokenizer and a random Qwen3-MoE (tiny_moe_config with `config` on top) saved in `d`."""
    from transformers import AutoModelForCausalLM

    from slime_ext.tokenizer import train_tokenizer
    from tests.megatron_fixtures import tiny_moe_config

    tok = train_tokenizer(["Question: what is 1 + 2?\nAnswer: 3", "the cat sat on the mat 12 34"] * 40,
                          vocab_size=300, out_dir=d)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_moe_config(vocab_size=len(tok), initializer_range=0.3, **config)) \
        .save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return served_checkpoint(tmp_path_factory.mktemp("m"))


@pytest.fixture(scope="module")
def server(model_dir):
    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.tokenizer import load_tokenizer

    torch.set_num_threads(1)
    state = ServerState(EmbeddedEngine.from_pretrained(str(model_dir)), load_tokenizer(model_dir), "tiny", max_tokens=12)
    srv = serve(state)
    yield srv, state
    srv.shutdown()
    state.batcher.close()


def url(srv) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def post(srv, path, payload):
    req = urllib.request.Request(url(srv) + path, data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


MSG = [{"role": "user", "content": "what is 1 + 2?"}]


def test_chat_completion_schema_and_seeded_sampling(server):
    srv, _ = server
    client = OpenAIClient(url(srv), model="tiny")
    a = client.chat(MSG, seed=5, max_tokens=10)
    b = client.chat(MSG, seed=5, max_tokens=10)
    assert a.text == b.text and a.finish_reason in ("stop", "length")
    assert a.usage["completion_tokens"] <= 10 and a.usage["prompt_tokens"] > 3
    others = {client.chat(MSG, seed=s, max_tokens=10).text for s in range(6, 12)}
    assert len(others) > 1  # sampling, not a constant
    code, body = post(srv, "/v1/completions", {"prompt": "the cat", "max_tokens": 5, "seed": 1})
    assert code == 200 and body["object"] == "text_completion" and isinstance(body["choices"][0]["text"], str)


def test_streaming_reassembles_the_non_streamed_text(server):
    srv, _ = server
    client = OpenAIClient(url(srv))
    full = client.chat(MSG, seed=9, max_tokens=12).text
    streamed = list(client.stream_chat(MSG, seed=9, max_tokens=12))
    assert "".join(streamed) == full and len(streamed) >= 2


def test_concurrent_requests_are_batched(server):
    srv, state = server
    client = OpenAIClient(url(srv), max_concurrency=8)
    before = state.batcher.calls
    results = client.chat_many([MSG] * 8, max_tokens=8, seed=3)
    assert all(not isinstance(r, Exception) for r in results)
    assert len({r.text for r in results}) == 1  # same seed, same prompt
    assert state.batcher.calls - before < 8


def test_sglang_client_talks_to_the_native_route(server, model_dir):
    """The client our loop uses for SGLang: same ids and logprobs as the embedded engine directly."""
    from sglang_patches.decoding import SamplingParams
    from slime_ext.data.generation import GenerateRequest
    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.engine.sglang_client import SGLangEngineClient

    srv, state = server
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    reqs = [GenerateRequest(f"g{i}", [5, 6, 7 + i], sp, seed=40 + i) for i in range(3)]
    client = SGLangEngineClient(url(srv), eos_token_id=state.tokenizer.eos_token_id)
    remote = client.generate(reqs)
    local = EmbeddedEngine.from_pretrained(str(model_dir)).generate(reqs)
    assert [r.output_ids for r in remote] == [r.output_ids for r in local]
    for r, l in zip(remote, local):
        assert r.finish_reason == l.finish_reason
        assert r.logprobs == pytest.approx(l.logprobs, abs=1e-5)


def test_bad_requests_get_clear_errors_and_no_retries(server):
    srv, _ = server
    code, body = post(srv, "/v1/chat/completions", {"messages": []})
    assert code == 400 and "messages" in body["error"]["message"]
    code, body = post(srv, "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]})
    assert code == 400 and "messages[0]" in body["error"]["message"]
    code, body = post(srv, "/v1/completions", {"prompt": 3})
    assert code == 400 and "'prompt'" in body["error"]["message"]
    code, body = post(srv, "/generate", {"input_ids": []})
    assert code == 400 and "input_ids" in body["error"]["message"]
    code, body = post(srv, "/nope", {})
    assert code == 404
    client = OpenAIClient(url(srv), max_retries=3, backoff_s=0.01)
    with pytest.raises(CallFailed, match="after 1 attempt"):
        client.chat([{"role": "robot", "content": "x"}])
    assert client.stats["retries"] == 0 and client.stats["failed"] == 1


def test_speak_only_streams_exactly_the_visible_projection(server):
    """SxS inference: with speak_only the stream carries the speak channel only; it equals the projection
    of the full output (same seed, same channel sampler) computed on the client side."""
    from sglang_patches.request_sampler import replay_annotations
    from sglang_patches.sxs import visible_token_ids
    from sglang_patches.sxs import tag_ids

    srv, state = server
    tags = tag_ids(state.tokenizer)
    spec = {"kind": "sxs_channel", **tags, "enforce": True}
    client = OpenAIClient(url(srv))
    prompt_ids = state.encode(state.render_chat(MSG))
    nonempty = 0
    for seed in range(8):
        code, body = post(srv, "/generate", {"input_ids": prompt_ids, "return_logprob": False, "sampling_params": {
            "max_new_tokens": 12, "sampling_seed": seed, "custom_params": {"sampler_specs": json.dumps([spec])}}})
        assert code == 200
        out = body["output_ids"]
        notes = replay_annotations([spec], seed, prompt_ids, out, state.tokenizer.eos_token_id)
        visible = state.tokenizer.decode(visible_token_ids(out, [n["channel"] for n in notes], tags),
                                         skip_special_tokens=True)
        streamed = "".join(client.stream_chat(MSG, seed=seed, max_tokens=12, speak_only=True))
        whole = client.chat(MSG, seed=seed, max_tokens=12, speak_only=True).text
        assert streamed == visible == whole
        nonempty += bool(visible)
        assert out[0] in (tags["think_open"], tags["speak_open"], state.tokenizer.eos_token_id)  # enforced
    assert nonempty >= 1


@pytest.mark.timeout(120)
def test_real_model_limits_and_edge_cases(server):
    """Issue 15: max_tokens past the model's positions is refused (it used to generate past them), seeds
    at the ends of the int64/uint64 range reach torch's generator, 2**70 is a 400 (it used to be a 500)."""
    srv, state = server
    assert state.context_length == 256
    code, body = post(srv, "/v1/chat/completions", {"messages": MSG, "max_tokens": 3000})
    assert code == 400 and "3000" in body["error"]["message"] and "256" in body["error"]["message"]
    assert body["error"]["code"] == "context_length_exceeded"
    code, body = post(srv, "/generate", {"input_ids": [5] * 250, "sampling_params": {"max_new_tokens": 12}})
    assert code == 400 and "262" in body["error"]["message"]
    code, body = post(srv, "/generate", {"input_ids": [5] * 250, "sampling_params": {"max_new_tokens": 6}})
    assert code == 200 and body["meta_info"]["completion_tokens"] <= 6
    for seed in (2 ** 64 - 1, -(2 ** 63)):
        code, body = post(srv, "/v1/chat/completions", {"messages": MSG, "seed": seed, "max_tokens": 3})
        assert code == 200, body
    code, body = post(srv, "/v1/chat/completions", {"messages": MSG, "seed": 2 ** 70})
    assert code == 400 and body["error"]["param"] == "seed"
    code, body = post(srv, "/v1/chat/completions", {"messages": MSG, "model": "other"})
    assert code == 404 and body["error"]["code"] == "model_not_found"
    # n=2: choice i is the n=1 answer for seed + i; logprobs are the engine's (the native route's) values
    code, both = post(srv, "/v1/completions", {"prompt": "the cat", "max_tokens": 6, "seed": 3, "n": 2, "logprobs": 0})
    assert code == 200 and len(both["choices"]) == 2
    for i in range(2):
        code, one = post(srv, "/v1/completions", {"prompt": "the cat", "max_tokens": 6, "seed": 3 + i})
        assert one["choices"][0]["text"] == both["choices"][i]["text"]
    code, native = post(srv, "/generate", {"input_ids": state.encode("the cat"), "return_logprob": True,
                                           "sampling_params": {"max_new_tokens": 6, "sampling_seed": 3}})
    lps = [t[0] for t in native["meta_info"]["output_token_logprobs"] if t[1] != state.tokenizer.eos_token_id]
    assert both["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(lps)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_1000_concurrent_requests_against_the_real_model(model_dir):
    """The load test of test_serve_limits with the tiny real model behind the server (about 20 s on 2 cores)."""
    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.serving import ServeConfig
    from slime_ext.tokenizer import load_tokenizer
    from tests.serving.test_serve_limits import _blast

    import asyncio
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4352)), hard))
    state = ServerState(EmbeddedEngine.from_pretrained(str(model_dir)), load_tokenizer(model_dir), "tiny", max_tokens=2,
                        config=ServeConfig(max_concurrency=128, max_queue=400))
    srv = serve(state)
    try:
        statuses, errors, wall, _ = asyncio.run(_blast(srv.url, 1000, {"prompt": "the cat", "max_tokens": 2}))
        print(f"\nreal-model load test: 1000 concurrent -> {statuses}, connection errors {len(errors)}, wall {wall:.1f}s")
        assert not errors and set(statuses) <= {200, 429} and sum(statuses.values()) == 1000 and statuses.get(200)
    finally:
        srv.shutdown()
        state.batcher.close()
