"""Routed experts over the SGLang protocol: the client's payload and decoding, and our server's encoding."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from sglang_patches.decoding import SamplingParams
from slime_ext.data.generation import GenerateRequest
from slime_ext.engine.sglang_client import SGLangEngineClient
from slime_ext.engine.sglang_payload import validate_generate_payload


def test_payload_asks_for_routed_experts_and_validates_against_io_struct():
    client = SGLangEngineClient("http://127.0.0.1:1", eos_token_id=1, moe_top_k=2)
    req = GenerateRequest("a", [3, 4, 5], SamplingParams(max_new_tokens=3), seed=0, return_routed_experts=True)
    payload = client.build_payload(req)
    assert payload["return_routed_experts"] is True
    validate_generate_payload(payload)  # a field of sglang's GenerateReqInput
    plain = client.build_payload(GenerateRequest("b", [3], SamplingParams(max_new_tokens=3), seed=0))
    assert "return_routed_experts" not in plain


def test_client_decodes_a_hand_built_sglang_answer():
    prompt, output, layers, top_k = [3, 4, 5], [7, 8, 1], 3, 2
    tokens = len(prompt) + len(output) - 1
    ids = np.arange(tokens * layers * top_k, dtype=np.int32).reshape(tokens, layers, top_k) % 8
    body = {"output_ids": output, "meta_info": {
        "finish_reason": {"type": "stop", "matched": 1}, "prompt_tokens": 3, "cached_tokens": 0,
        "output_token_logprobs": [[-0.5, t, None] for t in output],
        "routed_experts": base64.b64encode(ids.astype("<i4").tobytes()).decode()}}
    client = SGLangEngineClient("http://127.0.0.1:1", eos_token_id=1, moe_top_k=top_k)
    req = GenerateRequest("a", prompt, SamplingParams(max_new_tokens=3), seed=0, return_routed_experts=True)
    res = client._parse(req, body)
    assert res.routed_experts.dtype == torch.int16 and tuple(res.routed_experts.shape) == (tokens, layers, top_k)
    assert torch.equal(res.routed_experts.long(), torch.from_numpy(ids).long())
    with pytest.raises(ValueError, match="enable-return-routed-experts"):
        client._parse(req, {**body, "meta_info": {k: v for k, v in body["meta_info"].items() if k != "routed_experts"}})
    wrong = dict(body["meta_info"], routed_experts=base64.b64encode(ids[:-1].astype("<i4").tobytes()).decode())
    with pytest.raises(ValueError, match="not 5 tokens"):
        client._parse(req, {**body, "meta_info": wrong})


def test_routing_through_our_server_equals_the_embedded_engine(tmp_path):
    from transformers import AutoModelForCausalLM

    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.tokenizer import load_tokenizer, train_tokenizer
    from slime_ext.tools.serve import ServerState, serve
    from tests.megatron_fixtures import tiny_moe_config

    torch.set_num_threads(1)
    tok = train_tokenizer(["Question: what is 1 + 2?\nAnswer: 3", "the cat sat on the mat 12 34"] * 40,
                          vocab_size=300, out_dir=tmp_path)
    torch.manual_seed(0)
    cfg = tiny_moe_config(vocab_size=len(tok), initializer_range=0.3, num_experts=8, num_experts_per_tok=2)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    state = ServerState(EmbeddedEngine.from_pretrained(str(tmp_path)), load_tokenizer(tmp_path), "tiny", max_tokens=12)
    srv = serve(state)
    try:
        client = SGLangEngineClient(f"http://127.0.0.1:{srv.server_address[1]}", eos_token_id=tok.eos_token_id,
                                    moe_top_k=2)
        reqs = [GenerateRequest(f"q{i}", tok("Question: what is 1 + 2?")["input_ids"][: 4 + i],
                                SamplingParams(temperature=1.0, max_new_tokens=6 + i), seed=i,
                                return_routed_experts=True) for i in range(3)]
        served = client.generate(reqs)
        local = EmbeddedEngine.from_pretrained(str(tmp_path)).generate(reqs)
        for s, e in zip(served, local):
            assert s.error is None and s.output_ids == e.output_ids
            assert tuple(s.routed_experts.shape) == (len(s.output_ids) + s.prompt_len - 1, 2, 2)
            assert torch.equal(s.routed_experts, e.routed_experts)
    finally:
        srv.shutdown()
        state.batcher.close()
