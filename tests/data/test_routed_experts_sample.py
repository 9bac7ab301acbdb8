"""Sample.routed_experts (rollout routing replay): JSON round trip, shape checks, DA-GRPO's splice, config key."""

from __future__ import annotations

import json

import pytest
import torch

from slime_ext.data import Sample, SampleValidationError
from slime_ext.methods.dagrpo.core import splice, spliced_routing


def _routed(n, layers=2, k=2, seed=0):
    return torch.randint(0, 8, (n, layers, k), generator=torch.Generator().manual_seed(seed)).to(torch.int16)


def test_routed_experts_survive_a_json_dump_and_are_checked():
    s = Sample("s0", [5, 6, 7], [8, 9], routed_experts=_routed(4))
    back = Sample.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back.routed_experts.dtype == torch.int16 and torch.equal(back.routed_experts, s.routed_experts)
    with pytest.raises(SampleValidationError, match=r"sample 'bad': routed_experts has 5 token rows .* total_len - 1 = 4"):
        Sample("bad", [5, 6, 7], [8, 9], routed_experts=_routed(5))
    with pytest.raises(SampleValidationError, match="sample 'neg'"):
        Sample("neg", [5, 6, 7], [8, 9], routed_experts=_routed(4) - 5)
    assert torch.equal(Sample("list", [5, 6, 7], [8, 9], routed_experts=s.routed_experts.tolist()).routed_experts.long(),
                       s.routed_experts.long())


class _Tok:
    def __call__(self, text):
        return {"input_ids": [40 + (ord(c) % 10) for c in text]}


def test_dagrpo_splice_keeps_local_routing_and_marks_cloud_tokens_not_routed():
    eos, prompt = 1, [5, 6, 7]
    local = [20, 21, 22, eos]  # the engine fed prompt + 20 21 22 (the final EOS was never fed)
    routed = _routed(len(prompt) + len(local) - 1)
    sp = splice(local, "ab HELP", "HELP", "xyz", _Tok(), eos)
    assert sp.response_ids == [20, 21, 22] + [40 + (ord(c) % 10) for c in "xyz"] + [eos]
    out = spliced_routing(routed, len(prompt), local, eos, len(sp.response_ids))
    assert tuple(out.shape) == (len(prompt) + len(sp.response_ids) - 1, 2, 2)
    assert torch.equal(out[:6], routed[:6])  # prompt and the three local tokens: the engine's routing
    assert (out[6:] == -1).all()  # cloud text: the trainer routes it itself
    Sample("d", prompt, sp.response_ids, routed_experts=out)  # valid for the spliced sample
    # a response that ended without EOS: its last local token was never fed -> -1
    out2 = spliced_routing(_routed(5), 3, [20, 21, 22], eos, len(sp.response_ids))
    assert torch.equal(out2[:5], _routed(5)) and (out2[5:] == -1).all()
    assert spliced_routing(None, 3, local, eos, 4) is None


def test_routing_replay_on_a_dense_model_is_a_config_error():
    from slime_ext.config.schema import Config

    with pytest.raises(ValueError, match=r"train.routing_replay.*model.arch = 'qwen3'.*model.num_experts"):
        Config.model_validate({"model": {"arch": "qwen3"}, "train": {"routing_replay": True}})
    with pytest.raises(ValueError, match=r"train.routing_replay.*model.num_experts = 0"):
        Config.model_validate({"model": {"num_experts": 0, "num_experts_per_tok": 1}, "train": {"routing_replay": True}})
    assert Config.model_validate({"train": {"routing_replay": True}}).train.routing_replay
    assert not Config.model_validate({}).train.routing_replay
