"""Train-inference mismatch weights against hand-computed tables, and how they compose with the PPO loss."""

from __future__ import annotations

import math

import pytest
import torch

from slime_ext.algo import grpo_per_token_loss
from slime_ext.algo.mismatch import MismatchSpec, importance_weights, mismatch_sums

# One row of five trained tokens with ratios pi_old / pi_engine = 0.25, 0.8, 1, 1.5, 3
RATIOS = [0.25, 0.8, 1.0, 1.5, 3.0]


def _row(ratios, engine=-1.0):
    eng = torch.full((1, len(ratios)), engine)
    return eng + torch.log(torch.tensor([ratios])), eng


@pytest.mark.parametrize("mode, weights, truncated, masked", [
    ("none", [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]),
    ("truncate", [0.25, 0.8, 1.0, 1.5, 2.0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]),  # TIS, cap 2
    ("mask", [0.0, 0.8, 1.0, 1.5, 0.0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 1]),  # IcePop, band [0.5, 2]
])
def test_token_level_weights_match_the_table(mode, weights, truncated, masked):
    old, eng = _row(RATIOS)
    got = importance_weights(old, eng, torch.ones(1, 5), MismatchSpec(mode=mode, cap=2.0, low=0.5, high=2.0))
    assert got.weights[0].tolist() == pytest.approx(weights, abs=1e-6)
    assert got.truncated[0].tolist() == truncated
    assert got.masked[0].tolist() == masked


def test_sequence_and_geometric_levels_use_only_trained_tokens():
    # row 0: ratios 2, 0.5 and an untrained 3 -> sequence ratio 1; row 1: 1.5 x 2 = 3 (geometric sqrt 3)
    old = torch.log(torch.tensor([[2.0, 0.5, 3.0], [1.5, 2.0, 1.0]]))
    eng = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    seq_tis = importance_weights(old, eng, mask, MismatchSpec("truncate", "sequence", cap=2.0))
    assert seq_tis.weights.flatten().tolist() == pytest.approx([1.0] * 3 + [2.0] * 3, abs=1e-6)
    assert seq_tis.truncated.tolist() == [[0, 0, 0], [1, 1, 0]]  # only trained tokens count as truncated
    seq_mis = importance_weights(old, eng, mask, MismatchSpec("mask", "sequence", low=0.5, high=2.0))
    assert seq_mis.weights.flatten().tolist() == pytest.approx([1.0] * 3 + [0.0] * 3, abs=1e-6)  # MIS drops row 1
    assert seq_mis.masked.tolist() == [[0, 0, 0], [1, 1, 0]]
    geo = importance_weights(old, eng, mask, MismatchSpec("mask", "geometric", low=0.5, high=2.0))
    assert geo.weights.flatten().tolist() == pytest.approx([1.0] * 3 + [math.sqrt(3.0)] * 3, abs=1e-6)


def test_mismatch_sums_are_the_abs_difference_and_k3_kl():
    train = torch.tensor([[-1.0, -2.0, -0.5]])
    engine = torch.tensor([[-1.5, -2.0, -0.1]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    sums = mismatch_sums(train, engine, mask)
    assert sums["tokens"] == 2 and sums["abs_diff"] == pytest.approx(0.5) and sums["abs_diff_max"] == pytest.approx(0.5)
    # k3 of KL(engine || trainer) per token: exp(d) - 1 - d with d = train - engine = 0.5, 0
    assert sums["kl"] == pytest.approx(math.exp(0.5) - 1.5)


def test_duet_weights_and_mismatch_weights_multiply_the_clipped_surrogate():
    lp = torch.log(torch.tensor([[0.5, 0.5]]))
    old = torch.log(torch.tensor([[0.5, 0.25]]))  # ratios 1 and 2
    adv = torch.tensor([[1.0, -1.0]])
    duet = torch.tensor([[3.0, 3.0]])
    tis = torch.tensor([[0.5, 2.0]])
    loss, parts = grpo_per_token_loss(lp, old, adv, weights=duet, mismatch_weights=tis, eps_low=0.2, eps_high=0.2)
    # token 0: -A r = -1 (no clip) x 3 x 0.5; token 1: max(-(-1)(2), -(-1)(1.2)) = 2 x 3 x 2
    assert loss[0].tolist() == pytest.approx([-1.5, 12.0])
    assert parts["clip_frac"].tolist() == [[0.0, 0.0]]  # A < 0 and r > 1: the unclipped term is the larger


def test_clip_fraction_is_split_into_low_and_high_sides():
    lp = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5, 1.0]]))
    old = torch.zeros(1, 5)  # ratios 1.5, 0.5, 1.5, 0.5, 1
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0]])
    _, parts = grpo_per_token_loss(lp, old, adv, eps_low=0.2, eps_high=0.28)
    assert parts["clip_frac_high"].tolist() == [[1, 0, 0, 0, 0]]  # A > 0 above 1 + eps_high
    assert parts["clip_frac_low"].tolist() == [[0, 1, 0, 0, 0]]  # A < 0 below 1 - eps_low
    assert parts["clip_frac"].tolist() == [[1, 1, 0, 0, 0]]
