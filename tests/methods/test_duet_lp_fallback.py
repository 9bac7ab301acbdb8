"""DUET's exact allocator past its time limit: the LP relaxation's allocation (lp_fallback.py), flagged in the
step's metrics as `duet/allocator_fallback`.

The pathological instance, by hand. 64 prompts, L_q = 100.5 + 7 q (sum 20544, largest 541.5), s_q = sqrt(L_q)
(1 + d_q) with d_q in {-2, -1, 0, 1, 2} x 1e-7, n in [1, 32], B = 4.5 sum L. The gain per token of a prompt's
increment n -> n + 1 is s_q^2 / (n (n + 1) L_q) = (1 + d_q)^2 / (n (n + 1)): equal across prompts to 4e-7, so
choosing which prompts get a fifth rollout is a subset-sum over float lengths, which the exact search cannot
settle in 0.01 s. The LP relaxation (a fractional knapsack over the increments) lifts every prompt to n = 4
(3 sum L tokens above n_min = 1) and spends the last 0.5 sum L tokens on fifth rollouts, each worth 1/20 per
token: objective sum_q s_q^2 / 4 - 0.5 sum L / 20 = 0.225 sum L = 4622.4, up to the d_q (relative 1e-6).
An integral allocation that takes the LP's whole increments in its order up to the first that does not fit
falls short of it by less than that increment's gain, s_q^2 / 20 <= 541.5 (1 + 2e-7)^2 / 20 < 27.1.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from slime_ext.config import load_config
from slime_ext.data import Sample
from slime_ext.methods.duet.allocation import knapsack_allocation, objective
from slime_ext.methods.duet.exact_knapsack import ExactSearchTimeout, solve_exact
from slime_ext.methods.registry import build_method
from tests.conftest import CONFIGS


L = [100.5 + 7 * q for q in range(64)]
S = [math.sqrt(x) * (1 + 1e-7 * ((q % 5) - 2)) for q, x in enumerate(L)]
B = 4.5 * sum(L)
GAP_BOUND = 27.1  # one fifth-rollout increment of the longest prompt (module docstring)


def lp_optimum(s, lengths, budget, n_min, n_max) -> Fraction:
    """The LP relaxation's objective, exactly: n_min everywhere, then unit increments by decreasing gain per
    token (each prompt's in order, as they fall with n), the last one fractional."""
    items = sorted(((Fraction(x) ** 2 / (n * (n + 1)) / Fraction(ln), Fraction(ln), Fraction(x) ** 2 / (n * (n + 1)))
                    for x, ln in zip(s, lengths) for n in range(n_min, n_max)), key=lambda t: -t[0])
    room = Fraction(budget) - n_min * sum(Fraction(ln) for ln in lengths)
    value = sum(Fraction(x) ** 2 / n_min for x in s)
    for _, cost, gain in items:
        take = min(Fraction(1), room / cost)
        value, room = value - take * gain, room - take * cost
        if room == 0:
            break
    return value


def test_the_instance_is_as_the_docstring_says():
    assert sum(L) == 20544 and max(L) == 541.5 and B == 92448
    assert float(lp_optimum(S, L, B, 1, 32)) == pytest.approx(0.225 * 20544, rel=1e-6)
    with pytest.raises(ExactSearchTimeout) as caught:
        solve_exact(S, L, B, 1, 32, time_limit_s=0.01)
    assert caught.value.incumbent is not None and len(caught.value.incumbent) == 64


def test_past_its_time_limit_the_knapsack_falls_back_within_the_budget_and_near_the_lp_optimum():
    got = knapsack_allocation(S, L, B, n_min=1, n_max=32, time_limit_s=0.01)
    assert got.fallback
    assert all(1 <= n <= 32 for n in got.n)
    assert sum(n * Fraction(x) for n, x in zip(got.n, L)) <= Fraction(B)  # summed exactly
    lp = float(lp_optimum(S, L, B, 1, 32))
    assert got.lp_objective == pytest.approx(lp, rel=1e-6)  # what CBC found is the LP optimum
    assert lp - 1e-6 <= objective(S, got.n) <= lp + GAP_BOUND
    assert sorted(set(got.n)) == [4, 5]  # every prompt at 4, some at 5 (the LP's levels)


def test_a_normal_instance_is_solved_exactly():
    """Four prompts, room for one extra rollout: the exact search finishes, so no fallback."""
    got = knapsack_allocation([0.3, 0.2, 0.2, 0.1], [100.0] * 4, 500.0, n_min=1, n_max=4)
    assert not got.fallback and got.n == [2, 1, 1, 1] and got.lp_objective is None


def _one_rollout_groups(n_prompts: int) -> list[list[Sample]]:
    return [[Sample(f"r{q}", [3], [10, 11], group_id=str(q), label="7", response_text="\\boxed{7}",
                    logprobs=[-0.5, -0.5], metadata={"annotations": [{}, {}], "finish_reason": "stop"})]
            for q in range(n_prompts)]


@pytest.mark.parametrize("pathological", [False, True])
def test_the_step_metrics_flag_the_fallback(pathological):
    """`duet/allocator_fallback` is 1.0 for the step whose plan fell back, 0.0 for one solved exactly."""
    cfg = load_config(CONFIGS / "duet.yaml", ["duet.allocator=knapsack", "duet.knapsack_time_limit_s=0.01",
                                             f"duet.budget_tokens={int(B) if pathological else 400}"]).config
    method = build_method(cfg)
    prompts = [{"prompt": f"q{q}", "label": "7", "row_id": q} for q in range(64 if pathological else 4)]
    if pathological:
        for q in range(64):
            method.stats.sigma[str(q)], method.stats.length[str(q)] = (S[q], 1), (L[q], 1)
    plans = method.plan(prompts, 0)
    assert sum(p.n * method.stats.L(str(q)) for q, p in enumerate(plans)) <= method.budget([])
    metrics = method.finish(_one_rollout_groups(len(prompts)), 0)
    assert metrics["duet/allocator_fallback"] == (1.0 if pathological else 0.0)
