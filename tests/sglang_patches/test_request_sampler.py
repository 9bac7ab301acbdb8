"""Sampler protocol pieces: coin streams, chains, state round trips, replay; plain sampling and stops."""

from __future__ import annotations

import math

import pytest
import torch

from sglang_patches.request_sampler import (
    CoinStream,
    RequestView,
    Sampler,
    SamplerChain,
    StepAction,
    build_sampler,
    register_sampler,
    replay_annotations,
)
from sglang_patches.decoding import SamplingParams, StopChecker, choose_token, filtered_logits


@register_sampler
class CountingBoundary(Sampler):
    """Test sampler with coin state: redraws a coin after token ids < 10 (a 'boundary')."""

    kind = "test_counting_boundary"

    def __init__(self, seed: int, p: float = 0.5):
        super().__init__(seed)
        self.p = p
        self.coins = CoinStream(seed, "boundary")
        self.flag = self.coins.bernoulli(p)
        self.count = 0

    def on_token(self, token_id, view):
        self.count += 1
        out = {"flag": self.flag, "count": self.count}
        if token_id < 10:
            self.flag = self.coins.bernoulli(self.p)
        return out


@register_sampler
class ForceAt(Sampler):
    kind = "test_force_at"

    def __init__(self, seed: int, step: int, token: int):
        super().__init__(seed)
        self.step, self.token = step, token

    def adjust(self, logits, partner_logits, view):
        return StepAction(force_token=self.token) if view.step == self.step else StepAction()


def test_coin_stream_is_a_pure_function_of_seed_name_counter():
    a, b = CoinStream(7, "x"), CoinStream(7, "x")
    draws = [a.uniform() for _ in range(1000)]
    assert draws == [b.uniform() for _ in range(1000)]
    assert draws != [CoinStream(8, "x").uniform() for _ in range(1000)]
    assert draws != [CoinStream(7, "y").uniform() for _ in range(1000)]
    resumed = CoinStream.from_dict({"seed": 7, "name": "x", "counter": 500})
    assert [resumed.uniform() for _ in range(500)] == draws[500:]
    # uniformity: mean of 20k draws within 4 standard errors of U(0,1); Bernoulli frequency likewise
    stream = CoinStream(3, "u")
    many = [stream.uniform() for _ in range(20000)]
    assert abs(sum(many) / len(many) - 0.5) < 4 * math.sqrt(1 / 12 / len(many))
    assert all(0.0 <= x < 1.0 for x in many) and len(set(many)) == len(many)
    coins = CoinStream(5, "b")
    frac = sum(coins.bernoulli(0.3) for _ in range(20000)) / 20000
    assert abs(frac - 0.3) < 4 * math.sqrt(0.3 * 0.7 / 20000)


def test_chain_state_round_trip_and_replay_equal_the_live_run():
    specs = [{"kind": "test_counting_boundary", "p": 0.4}]
    tokens = [12, 3, 40, 7, 8, 55, 2, 90, 11, 4]
    live = SamplerChain.from_specs(specs, seed=21)
    annotations = []
    for i, t in enumerate(tokens):
        view = RequestView("r", 21, [1, 2], tokens[:i], eos_token_id=0)
        annotations.append(live.on_token(t, view))
        if i == 4:  # serialise mid-way and continue from the copy
            saved = live.state_dict()
            copy = SamplerChain.from_specs(specs, seed=21)
            copy.load_state_dict(saved)
            live = copy
    assert annotations == replay_annotations(specs, 21, [1, 2], tokens, eos_token_id=0)
    assert [a["count"] for a in annotations] == list(range(1, 11))
    long_tokens = [3, 12] * 40  # 40 boundaries: two seeds agreeing on every coin has probability ~1e-9
    flags = {seed: [a["flag"] for a in replay_annotations(specs, seed, [1], long_tokens, 0)] for seed in (21, 22)}
    assert flags[21] != flags[22]


def test_chain_force_finish_and_annotation_conflicts():
    chain = SamplerChain.from_specs([{"kind": "test_force_at", "step": 1, "token": 33}], seed=0)
    logits = torch.zeros(50)
    assert chain.adjust(logits, None, RequestView("r", 0, [1], [], 0)).force_token is None
    assert chain.adjust(logits, None, RequestView("r", 0, [1], [5], 0)).force_token == 33
    both = SamplerChain.from_specs([{"kind": "test_counting_boundary"}, {"kind": "test_counting_boundary"}], seed=0)
    with pytest.raises(ValueError, match="both annotate"):
        both.on_token(5, RequestView("r", 0, [1], [], 0))
    with pytest.raises(ValueError, match="unknown sampler kind 'nope'"):
        build_sampler({"kind": "nope"}, 0)
    with pytest.raises(TypeError, match="bad parameters"):
        build_sampler({"kind": "test_force_at", "step": 1, "token": 2, "oops": 3}, 0)


def test_filtering_hand_values():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    top_k = torch.softmax(filtered_logits(logits, SamplingParams(top_k=2)), -1)
    assert torch.allclose(top_k, torch.tensor([0.5, 0.2, 0, 0, 0]) / 0.7, atol=1e-6)
    top_p = torch.softmax(filtered_logits(logits, SamplingParams(top_p=0.8)), -1)
    # 0.5 + 0.2 = 0.7 < 0.8, so the token crossing 0.8 (0.15) is kept: mass 0.85
    assert torch.allclose(top_p, torch.tensor([0.5, 0.2, 0.15, 0, 0]) / 0.85, atol=1e-6)
    hot = torch.softmax(filtered_logits(logits, SamplingParams(temperature=2.0)), -1)
    expected = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]).sqrt()
    assert torch.allclose(hot, expected / expected.sum(), atol=1e-6)
    assert choose_token(logits, SamplingParams(temperature=0.0), None) == 0


def test_sampling_frequencies_follow_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(3)
    for _ in range(6000):
        counts[choose_token(probs.log(), SamplingParams(), gen)] += 1
    freq = counts / 6000
    assert torch.all((freq - probs).abs() < 4 * torch.sqrt(probs * (1 - probs) / 6000))


def test_stop_checker():
    decode = lambda ids: "".join(chr(96 + i) for i in ids)  # 1 -> 'a', 2 -> 'b', ...
    stop = StopChecker(SamplingParams(max_new_tokens=6, stop_token_ids=[9], stop=["cab"]), eos_token_id=0, decode=decode)
    assert stop.check([1, 2]) is None
    assert stop.check([1, 0]) == "stop"
    assert stop.check([1, 9]) == "stop"
    assert stop.check([4, 3, 1, 2]) == "stop"  # "dcab" contains "cab"
    assert stop.check([1, 1, 1, 1, 1, 1]) == "length"
    with pytest.raises(ValueError, match="need a tokenizer"):
        StopChecker(SamplingParams(stop=["x"]), 0, None)
    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_k=0), dict(max_new_tokens=0)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
