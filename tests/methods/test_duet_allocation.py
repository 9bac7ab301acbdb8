"""DUET allocation: Theorem 1, the integer knapsack against brute force, the bracket pitfall, budgets."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from slime_ext.methods.duet.allocation import (BudgetError, bisect_allocation, closed_form, knapsack_allocation,
                                            objective, stratification_factors)


def test_continuous_bisection_matches_theorem_1():
    rng = random.Random(0)
    for _ in range(20):
        q = rng.randint(2, 40)
        s = [rng.uniform(0.01, 2.0) for _ in range(q)]
        L = [rng.uniform(20, 800) for _ in range(q)]
        B = rng.uniform(0.5, 4.0) * sum(L)
        n_star, lam_star = closed_form(s, L, B)
        # Theorem 1 itself: n proportional to s / sqrt(L), spending exactly B
        assert np.allclose(n_star * np.sqrt(L) / np.asarray(s), n_star[0] * math.sqrt(L[0]) / s[0])
        assert float(np.dot(n_star, L)) == pytest.approx(B, rel=1e-12)
        got = bisect_allocation(s, L, B, iterations=80, integer=False)
        assert got.lam == pytest.approx(lam_star, rel=1e-6)
        assert np.allclose(got.n_real, n_star, rtol=1e-6)


def _brute_force(s, L, B, n_min, n_max):
    best = None
    for n in itertools.product(range(n_min, n_max + 1), repeat=len(s)):
        if sum(k * l for k, l in zip(n, L)) <= B:
            v = objective(s, n)
            if best is None or v < best[0] * (1 - 1e-12):  # relative: objectives are ~1e-12 at s ~ 1e-6
                best = (v, n)
    return best


def test_knapsack_is_optimal_on_small_instances_and_within_budget():
    rng = random.Random(1)
    for _ in range(12):
        q = rng.randint(2, 4)
        s = [rng.uniform(0.05, 1.5) for _ in range(q)]
        L = [rng.randint(10, 90) for _ in range(q)]
        B = rng.uniform(1.2, 3.5) * sum(L)
        got = knapsack_allocation(s, L, B, n_min=1, n_max=5)
        want_value, _ = _brute_force(s, L, B, 1, 5)
        assert got.cost <= B
        assert objective(s, got.n) == pytest.approx(want_value, rel=1e-9)
        # the bisection allocation is feasible and no better than the exact one
        approx = bisect_allocation(s, L, B, n_min=1, n_max=5)
        assert approx.cost <= B and objective(s, approx.n) >= want_value - 1e-9


@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
def test_knapsack_is_exact_at_tiny_and_large_signal_scales(scale):
    """70 random instances per scale against brute force, optimal to 1e-9 relative. (With the former
    pulp/CBC solver, before its objective was scaled, CBC's absolute tolerances swallowed the s^2 ~ 1e-12
    coefficients: 281 of 300 instances at scale 1e-6 came back non-optimal, gap up to 400%.)"""
    rng = random.Random(15 + int(math.log10(scale)))
    for _ in range(70):
        q = rng.randint(2, 4)
        s = [scale * rng.uniform(0.01, 1.5) for _ in range(q)]
        L = [rng.randint(10, 900) for _ in range(q)]
        B = rng.uniform(1.2, 4.0) * sum(L)
        got = knapsack_allocation(s, L, B, n_min=1, n_max=5)
        want_value, _ = _brute_force(s, L, B, 1, 5)
        assert got.cost <= B
        # abs=0: pytest.approx's default abs=1e-12 would accept anything at s ~ 1e-6
        assert objective(s, got.n) == pytest.approx(want_value, rel=1e-9, abs=0), (s, L, B, got.n)


def test_knapsack_is_not_misled_by_cbc_preprocessing():
    """A regression instance from the former pulp/CBC solver, whose preprocessing (Cgl) fixed variables
    wrongly and reported the 37%-worse [1, 2, 1] as Optimal; [2, 1, 1] costs 1494 <= B and is the optimum."""
    s, L, B = [0.7601222025785034, 0.040327550433621843, 0.7019359455766575], [242, 289, 721], 1560.2266558941026
    got = knapsack_allocation(s, L, B, n_min=1, n_max=5)
    assert got.n == [2, 1, 1] and got.cost == 1494.0
    assert objective(s, got.n) == pytest.approx(_brute_force(s, L, B, 1, 5)[0], rel=1e-12, abs=0)


def test_bracket_is_widened_at_the_cold_start_floor():
    """All prompts at the floor s = 0.01 with long rollouts: the crossing lies below e^-20, where a
    fixed [e^-20, e^20] bracket would stop and spend about 69% of B. We must spend nearly all of it."""
    s, L = [0.01] * 8, [400.0] * 8
    B = 16 * 400.0 * 8
    fixed_range_n = 0.01 / math.sqrt(math.exp(-20) * 400)
    assert round(fixed_range_n) * 400 * 8 / B < 0.75  # what the reference code would spend
    got = bisect_allocation(s, L, B, n_max=32)
    assert got.cost <= B and got.cost >= 0.95 * B
    assert got.lam < math.exp(-20)


def test_saturation_budget_floor_and_warm_start():
    s, L = [0.5, 1.0, 2.0], [50.0, 100.0, 200.0]
    big = bisect_allocation(s, L, 1e9, n_max=8)
    assert big.saturated and big.n == [8, 8, 8]
    assert knapsack_allocation(s, L, 1e9, n_max=8).n == [8, 8, 8]
    with pytest.raises(BudgetError, match="cannot cover n_min=2 rollout\\(s\\) of each of the 3 prompts"):
        bisect_allocation(s, L, 500.0, n_min=2)
    with pytest.raises(BudgetError, match="cannot cover"):
        knapsack_allocation(s, L, 300.0)
    cold = bisect_allocation(s, L, 1500.0, n_max=16)
    warm = bisect_allocation(s, L, 1500.0, n_max=16, lam_init=cold.lam)
    assert warm.cost <= 1500.0 and cold.cost <= 1500.0
    assert warm.n == cold.n or objective(s, warm.n) == pytest.approx(objective(s, cold.n), rel=0.05)
    # more signal (s) and shorter rollouts (L) get more samples
    assert cold.n[2] * math.sqrt(L[2]) / s[2] == pytest.approx(cold.n[0] * math.sqrt(L[0]) / s[0], rel=0.5)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="s_q > 0"):
        bisect_allocation([0.0, 1.0], [10, 10], 100)
    with pytest.raises(ValueError, match="equal-length"):
        bisect_allocation([1.0], [10, 10], 100)
    with pytest.raises(ValueError, match="n_min <= n_max"):
        bisect_allocation([1.0], [10], 100, n_min=3, n_max=2)


def test_stratification_factors_from_actual_counts():
    assert stratification_factors([2, 4, 6]) == pytest.approx([0.5, 1.0, 1.0])
    assert stratification_factors([1, 1, 100], eps_pre=0.05) == pytest.approx([0.05, 0.05, 1.0])
    assert stratification_factors([]) == []
