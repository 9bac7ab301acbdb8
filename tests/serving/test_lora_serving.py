"""A LoRA adapter served by the embedded engine and the project's server (SGLang's /load_lora_adapter_from_tensors
with PEFT names, requests naming it by lora_path): the engine's outputs with the adapter equal a model whose
weights were merged by hand; a newer adapter replaces the old one exactly; unloading restores the base; requests
that name another adapter are refused; the client's payloads pass SGLang's io_struct."""

from __future__ import annotations

import copy

import pytest
import torch

from sglang_patches.decoding import SamplingParams
from slime_ext.data.generation import GenerateRequest
from slime_ext.engine.embedded import EmbeddedEngine
from tests.serving.test_serve_weights import _checkpoint, call, file_system_sharing, in_process  # noqa: F401

CONFIG = {"r": 2, "lora_alpha": 6.0, "peft_type": "LORA", "target_modules": ["q_proj", "v_proj", "o_proj"]}
SEQS, STARTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15]], [2, 1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return _checkpoint(tmp_path_factory.mktemp("lora_serving"), seed=0)


def adapter(model: torch.nn.Module, modules: tuple[str, ...], seed: int) -> list[tuple[str, torch.Tensor]]:
    """PEFT-named A [r, in] and B [out, r] for `modules` of every layer (B not zero: the adapter changes outputs)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in modules:
            out_f, in_f = module.weight.shape
            out.append((f"base_model.model.{name}.lora_A.weight", torch.randn(CONFIG["r"], in_f, generator=gen) * 0.3))
            out.append((f"base_model.model.{name}.lora_B.weight", torch.randn(out_f, CONFIG["r"], generator=gen) * 0.3))
    return out


def merged_engine(base: EmbeddedEngine, named: list[tuple[str, torch.Tensor]]) -> EmbeddedEngine:
    """The reference: a copy of the model with W + (alpha / r) B A written into each adapted weight by hand."""
    model = copy.deepcopy(base.model)
    params = dict(model.named_parameters())
    tensors = dict(named)
    scale = CONFIG["lora_alpha"] / CONFIG["r"]
    with torch.no_grad():
        for key in (k for k in tensors if k.endswith("lora_A.weight")):
            module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            params[f"{module}.weight"] += scale * tensors[key.replace("lora_A", "lora_B")] @ tensors[key]
    return EmbeddedEngine(model, base.eos_token_id)


def greedy(rid: str, lora: str | None) -> GenerateRequest:
    return GenerateRequest(rid, [5, 6, 7], SamplingParams(temperature=0.0, max_new_tokens=8), 0, lora_name=lora)


def test_the_engine_with_an_adapter_computes_what_the_merged_model_does(model_dir):
    torch.set_num_threads(1)
    engine = EmbeddedEngine.from_pretrained(str(model_dir))
    base_scores = engine.score(SEQS, STARTS, "policy")
    first = adapter(engine.model, ("q_proj", "v_proj", "o_proj"), seed=1)
    reference = merged_engine(engine, first)
    assert engine.load_lora_adapter("v1", CONFIG, first) == 3 * len(engine.model.model.layers)
    for got, want in zip(engine.score(SEQS, STARTS, "policy"), reference.score(SEQS, STARTS, "policy")):
        assert got == pytest.approx(want, abs=1e-5)
    (mine,), (theirs,) = engine.generate([greedy("a", "v1")]), reference.generate([greedy("a", None)])
    assert mine.output_ids == theirs.output_ids and mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)
    assert engine.score(SEQS, STARTS, "policy") != base_scores
    with pytest.raises(ValueError, match="asks for LoRA adapter None but this engine serves 'v1'"):
        engine.generate([greedy("b", None)])
    # a newer adapter on q_proj only: v_proj and o_proj get their base weights back, q_proj the new update
    second = adapter(engine.model, ("q_proj",), seed=2)
    engine.load_lora_adapter("v2", CONFIG, second)
    for got, want in zip(engine.score(SEQS, STARTS, "policy"), merged_engine(
            EmbeddedEngine.from_pretrained(str(model_dir)), second).score(SEQS, STARTS, "policy")):
        assert got == pytest.approx(want, abs=1e-5)
    engine.unload_lora_adapter("v2")
    assert engine.score(SEQS, STARTS, "policy") == base_scores  # the base, exactly
    with pytest.raises(ValueError, match="lora_A and lora_B are needed"):
        engine.load_lora_adapter("bad", CONFIG, first[:1])
    with pytest.raises(ValueError, match="not loaded"):
        engine.unload_lora_adapter("v2")


def test_the_server_loads_serves_and_unloads_an_adapter_through_the_client(model_dir, file_system_sharing):
    """CPU tensors travel shared by file name (as the trainer's sync sends them to a CPU server)."""
    from slime_ext.engine.sglang_client import SGLangEngineClient

    with in_process(model_dir) as (srv, state):
        named = adapter(state.engine.model, ("q_proj", "v_proj", "o_proj"), seed=1)
        reference = merged_engine(EmbeddedEngine.from_pretrained(str(model_dir)), named)
        client = SGLangEngineClient(srv.url, validate=True)  # payloads checked against SGLang's io_struct
        client.load_lora_adapter_from_tensors("policy-v1", CONFIG, named)
        (got,), (want,) = client.generate([greedy("a", "policy-v1")]), reference.generate([greedy("a", None)])
        assert got.output_ids == want.output_ids and got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
        code, body = call(srv.url, "/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}})
        assert code == 400 and body["error"]["param"] == "lora_path" and "serves 'policy-v1'" in body["error"]["message"]
        code, body = call(srv.url, "/generate", {"input_ids": [[5, 6], [7, 8]], "lora_path": ["policy-v1", "x"],
                                                 "sampling_params": {"max_new_tokens": 2}})
        assert code == 400 and body["error"]["param"] == "lora_path[1]"
        from sglang.srt.utils.common import MultiprocessingSerializer

        half = [MultiprocessingSerializer.serialize(named[:1], output_str=True)]
        code, body = call(srv.url, "/load_lora_adapter_from_tensors",
                          {"lora_name": "bad", "config_dict": CONFIG, "serialized_named_tensors": half})
        assert code == 400 and "lora_A and lora_B are needed" in body["message"]
        client.unload_lora_adapter("policy-v1")
        code, body = call(srv.url, "/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}})
        assert code == 200


def test_expert_adapters_merge_into_each_experts_projection(model_dir):
    """PEFT names per expert (`mlp.experts.{e}.gate_proj` ..., as the trainer's export writes them) merge into the
    engine's expert weights (stacked in the HF model): the scores equal a model given W + (alpha / r) B A for those
    weights as a plain weight update."""
    torch.set_num_threads(1)
    engine = EmbeddedEngine.from_pretrained(str(model_dir))
    cfg = engine.model.config
    gen = torch.Generator().manual_seed(4)
    named, updates = [], []
    scale = CONFIG["lora_alpha"] / CONFIG["r"]
    for layer in range(cfg.num_hidden_layers):
        for e in (0, cfg.num_experts - 1):
            for proj, (out_f, in_f) in {"gate_proj": (cfg.moe_intermediate_size, cfg.hidden_size),
                                        "up_proj": (cfg.moe_intermediate_size, cfg.hidden_size),
                                        "down_proj": (cfg.hidden_size, cfg.moe_intermediate_size)}.items():
                module = f"model.layers.{layer}.mlp.experts.{e}.{proj}"
                a = torch.randn(CONFIG["r"], in_f, generator=gen) * 0.5
                b = torch.randn(out_f, CONFIG["r"], generator=gen) * 0.5
                named += [(f"base_model.model.{module}.lora_A.weight", a), (f"base_model.model.{module}.lora_B.weight", b)]
                updates.append((f"{module}.weight", engine.parameter(f"{module}.weight").detach() + scale * b @ a))
    reference = EmbeddedEngine.from_pretrained(str(model_dir))
    reference.update_weights_from_tensor(updates)
    base_scores = engine.score(SEQS, STARTS, "policy")
    assert engine.load_lora_adapter("experts", CONFIG, named) == len(updates)
    scores = engine.score(SEQS, STARTS, "policy")
    assert scores != base_scores
    for got, want in zip(scores, reference.score(SEQS, STARTS, "policy")):
        assert got == pytest.approx(want, abs=1e-5)
    engine.unload_lora_adapter("experts")
    assert engine.score(SEQS, STARTS, "policy") == base_scores
