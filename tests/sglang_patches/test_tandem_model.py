"""Tandem's two-model SGLang path, every part that runs without a GPU.

The model class itself needs SGLang's CUDA model stack (checked by scripts/tandem_sglang_smoke.py on a
GPU server); here: the logits layout, weight routing, config and checkpoint packaging, the KV-layer
renumbering on SGLang's real RadixAttention, and the processor (the real CustomLogitProcessor subclass
driven by SGLang's own `apply_custom_logit_processor`) on tandem-shaped logits.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from sglang_patches.request_sampler import RequestView, build_sampler
from sglang_patches.tandem_model import (JUNIOR_LOGIT_OFFSET, combine_logits, inner_config, route_weight,
                                         shift_attention_layer_ids, split_logits, tandem_config,
                                         write_tandem_checkpoint)

V = 8
EOS = 1
BOUNDARY = [2, 3]


def test_logits_layout_round_trips_and_keeps_solo_sampling_on_the_senior():
    senior, junior = torch.randn(3, V), torch.randn(3, V)
    both = combine_logits(senior, junior)
    assert both.shape == (3, 2 * V)
    s, j = split_logits(both, V)
    assert torch.equal(s, senior) and torch.allclose(j, junior, atol=1e-4)
    # without the processor, softmax over the 2V row is the senior's distribution (junior half ~ 0)
    probs = torch.softmax(both, -1)
    assert torch.allclose(probs[:, :V], torch.softmax(senior, -1), atol=1e-6)
    assert float(probs[:, V:].sum()) == 0.0
    with pytest.raises(ValueError, match="expected 2 x vocab"):
        split_logits(senior, V)


def test_weight_names_route_to_senior_unless_prefixed():
    assert route_weight("model.layers.0.mlp.gate.weight") == ("senior", "model.layers.0.mlp.gate.weight")
    assert route_weight("junior.lm_head.weight") == ("junior", "lm_head.weight")


def test_served_config_doubles_layers_for_the_shared_kv_pool():
    from tests.megatron_fixtures import tiny_moe_config

    base = tiny_moe_config()
    served = tandem_config(base, "/ckpt/junior")
    assert served.num_hidden_layers == 2 * base.num_hidden_layers and served.tandem_layers == base.num_hidden_layers
    assert served.architectures == ["TandemQwen3MoeForCausalLM"]
    inner = inner_config(served)
    assert inner.num_hidden_layers == base.num_hidden_layers and base.num_hidden_layers == tiny_moe_config().num_hidden_layers
    with pytest.raises(ValueError, match="not a tandem config"):
        inner_config(base)


def test_junior_attention_layers_move_behind_the_seniors():
    radix = pytest.importorskip("sglang.srt.layers.radix_attention")
    layers = torch.nn.ModuleList(
        torch.nn.ModuleDict({"attn": radix.RadixAttention(num_heads=2, head_dim=4, scaling=0.5, num_kv_heads=1, layer_id=i)})
        for i in range(3))
    assert shift_attention_layer_ids(layers, 3) == 3
    assert [m["attn"].layer_id for m in layers] == [3, 4, 5]


def _tiny_checkpoint(path, seed: int, layers: int = 2, vocab_words=("a", "b")):
    from transformers import AutoModelForCausalLM

    from slime_ext.tokenizer import train_tokenizer
    from tests.megatron_fixtures import tiny_moe_config

    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(tiny_moe_config(num_hidden_layers=layers)).save_pretrained(path)
    train_tokenizer([" ".join(vocab_words)] * 20, vocab_size=270, out_dir=path)
    return path


def test_checkpoint_packaging_checks_the_pair(tmp_path):
    senior = _tiny_checkpoint(tmp_path / "s", 0)
    junior = _tiny_checkpoint(tmp_path / "j", 1)
    out = write_tandem_checkpoint(senior, junior, tmp_path / "pair")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["TandemQwen3MoeForCausalLM"] and cfg["num_hidden_layers"] == 4
    assert cfg["tandem_layers"] == 2 and cfg["tandem_junior_path"] == str(junior.resolve())
    weights = next(out.glob("*.safetensors"))
    assert weights.is_symlink() and weights.resolve().parent == senior.resolve()
    deeper = _tiny_checkpoint(tmp_path / "d", 2, layers=3)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        write_tandem_checkpoint(senior, deeper, tmp_path / "bad")
    other_vocab = _tiny_checkpoint(tmp_path / "v", 3, vocab_words=("x", "y", "zz"))
    with pytest.raises(ValueError, match="vocabularies differ"):
        write_tandem_checkpoint(senior, other_vocab, tmp_path / "bad2")


# -- the processor on a two-model server ----------------------------------------------------------
pytest.importorskip("sglang")  # the real package (scripts/install_sglang_cpu.sh); our adapter must then import
import sglang_patches.sglang_adapter as adapter  # noqa: E402


class FakeReq:
    def __init__(self, rid, prompt):
        self.rid, self.origin_input_ids, self.output_ids = rid, list(prompt), []

    def finished(self):
        return False


@pytest.fixture(autouse=True)
def _fresh_registry():
    adapter.clear_registry()
    yield
    adapter.clear_registry()


def tandem_spec(p=0.5, kappa=2):
    return [{"kind": "tandem", "p_senior": p, "kappa": kappa, "boundary_ids": BOUNDARY}]


def test_processor_samples_the_authors_half_and_matches_the_sampler_replay():
    from tests.sglang_patches.test_sglang_adapter import FakeBatchInfo, _sglang_apply_fn

    apply = _sglang_apply_fn()
    proc = adapter.SamplerLogitProcessor.to_str()
    torch.manual_seed(0)
    reqs = [FakeReq(f"r{i}", [4, 5]) for i in range(4)]
    params = [adapter.build_custom_params(tandem_spec(), seed=i, eos_token_id=EOS, rid=r.rid, partner_vocab=V)
              | {"__req__": r} for i, r in enumerate(reqs)]
    for step in range(12):
        senior, junior = torch.randn(len(reqs), V), torch.randn(len(reqs), V)
        logits = combine_logits(senior, junior)
        apply(logits, FakeBatchInfo([proc] * len(reqs), params))
        assert torch.all(logits[:, V:] == -math.inf)
        for i, r in enumerate(reqs):
            # which author the sampler state says is next, from the replay of the tokens so far
            sampler = build_sampler(tandem_spec()[0], i)
            for t, tok in enumerate(r.output_ids):
                sampler.on_token(tok, RequestView(r.rid, i, r.origin_input_ids, r.output_ids[:t], EOS))
            expected = senior[i] if sampler.author_next == 1 else junior[i]
            assert torch.allclose(logits[i, :V], expected, atol=1e-4)
            r.output_ids.append(int(torch.argmax(logits[i])))  # "sample" greedily from the processed row
    authors = [a["author"] for r in reqs for a in adapter.annotations_for(r.rid, r.output_ids)]
    assert 0 < sum(authors) < len(authors)


def test_solo_requests_on_a_tandem_server_see_only_the_senior():
    from tests.sglang_patches.test_sglang_adapter import FakeBatchInfo, _sglang_apply_fn

    apply = _sglang_apply_fn()
    proc = adapter.SamplerLogitProcessor.to_str()
    senior, junior = torch.randn(1, V), torch.randn(1, V) + JUNIOR_LOGIT_OFFSET  # junior would dominate
    logits = combine_logits(senior, junior)
    apply(logits, FakeBatchInfo([proc], [{"partner_vocab": V, "__req__": FakeReq("solo", [4])}]))
    assert torch.equal(logits[0, :V], senior[0]) and torch.all(logits[0, V:] == -math.inf)


def test_partner_samplers_need_the_tandem_server():
    with pytest.raises(adapter.SamplerHostError, match="tandem_model"):
        adapter.check_hostable(tandem_spec())
    assert adapter.check_hostable(tandem_spec(), partner=True).needs_partner


def test_client_sends_partner_vocab_and_the_processor_for_every_request():
    from sglang_patches.decoding import SamplingParams
    from slime_ext.data.generation import GenerateRequest
    from slime_ext.engine.sglang_client import SGLangEngineClient

    client = SGLangEngineClient("http://127.0.0.1:1", eos_token_id=EOS, partner_vocab=V)
    sp = SamplingParams(max_new_tokens=4)
    tandem = client.build_payload(GenerateRequest("t", [4], sp, 3, sampler_specs=tandem_spec()))
    assert tandem["sampling_params"]["custom_params"]["partner_vocab"] == V
    assert tandem["custom_logit_processor"] == adapter.SamplerLogitProcessor.to_str()
    solo = client.build_payload(GenerateRequest("s", [4], sp, 3))
    assert solo["sampling_params"]["custom_params"] == {"partner_vocab": V}
    assert "custom_logit_processor" in solo
    plain = SGLangEngineClient("http://127.0.0.1:1", eos_token_id=EOS).build_payload(GenerateRequest("p", [4], sp, 3))
    assert "custom_logit_processor" not in plain
