"""DUET's exact allocator (`duet.allocator: knapsack`) against exact oracles, near-ties included.

The oracles work in exact rational arithmetic (Fraction, then integers over a common denominator) so that
no tolerance can decide which allocation is better: brute force over every allocation for small
instances, and a dynamic program over integer token costs for medium ones. 0 non-optimal allowed, and
the tie rule (smallest objective, then smallest planned cost, then the lexicographically smallest n) is
checked too, so the allocation is a function of the inputs only.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from fractions import Fraction
from typing import Optional, Sequence

import pytest

from slime_ext.methods.duet.allocation import BudgetError, bisect_allocation, knapsack_allocation

Key = tuple[Fraction, Fraction, tuple[int, ...]]  # (objective, cost, n): what "best" minimises


def _exact_objective(s: Sequence[float], n: Sequence[int]) -> Fraction:
    return sum((Fraction(x) ** 2 / k for x, k in zip(s, n)), Fraction(0))


def _exact_cost(L: Sequence[float], n: Sequence[int]) -> Fraction:
    return sum((k * Fraction(x) for x, k in zip(L, n)), Fraction(0))


def _brute_force(s, L, B, n_min, n_max) -> Optional[Key]:
    """Every allocation, compared as integers over one common denominator (exact and fast enough)."""
    choices = range(n_min, n_max + 1)
    vals = [[Fraction(x) ** 2 / k for k in choices] for x in s]
    costs = [[k * Fraction(x) for k in choices] for x in L]
    den = math.lcm(*(f.denominator for row in vals + costs for f in row), Fraction(B).denominator)
    ival = [[int(f * den) for f in row] for row in vals]
    icost = [[int(f * den) for f in row] for row in costs]
    budget = int(Fraction(B) * den)
    best = None
    for idx in itertools.product(range(len(choices)), repeat=len(s)):
        c = sum(icost[q][i] for q, i in enumerate(idx))
        if c <= budget:
            key = (sum(ival[q][i] for q, i in enumerate(idx)), c, idx)
            if best is None or key < best:
                best = key
    if best is None:
        return None
    n = tuple(n_min + i for i in best[2])
    return Fraction(best[0], den), Fraction(best[1], den), n


def _dp_over_costs(s, L, B, n_min, n_max) -> Fraction:
    """The optimal objective by a DP over integer costs (L must be integers): best[c] = min objective of
    the prompts so far at total cost exactly c, objectives as integers over one common denominator.
    For instances too big to enumerate."""
    budget = math.floor(B)
    choices = range(n_min, n_max + 1)
    vals = [[Fraction(x) ** 2 / k for k in choices] for x in s]
    den = math.lcm(*(f.denominator for row in vals for f in row))
    best: dict[int, int] = {0: 0}
    for row, l in zip(vals, L):
        nxt: dict[int, int] = {}
        for c, v in best.items():
            for k, f in zip(choices, row):
                c2, v2 = c + k * int(l), v + int(f * den)
                if c2 <= budget and (c2 not in nxt or v2 < nxt[c2]):
                    nxt[c2] = v2
        best = nxt
    return Fraction(min(best.values()), den)


def _signals(kind: str, q: int, scale: float, L: Sequence[float], rng: random.Random) -> list[float]:
    """equal: one signal for all; near: one signal perturbed by 0 or +-1e-8..1e-6 relative; ratio: signals
    that make the prompts' marginal gains per token s^2 / (k (k+1) L) tie (up to 1e-8..1e-6) across
    prompts; random: independent signals."""
    base = scale * rng.uniform(0.05, 1.5)
    deltas = [0.0, 0.0, 1e-8, -1e-8, 3e-8, 1e-7, -1e-7, 5e-7, 1e-6, -1e-6]
    if kind == "equal":
        return [base] * q
    if kind == "near":
        return [base * (1 + rng.choice(deltas)) for _ in range(q)]
    if kind == "ratio":
        c = base / math.sqrt(L[0])
        return [c * math.sqrt(x) * (1 + rng.choice(deltas)) for x in L]
    return [scale * rng.uniform(0.01, 1.5) for _ in range(q)]


def _lengths(q: int, rng: random.Random) -> list[float]:
    """Integer lengths (equal or not) or running-mean-like floats, as PromptStats produces."""
    pick = rng.random()
    if pick < 0.3:
        return [float(rng.randint(10, 900))] * q
    if pick < 0.7:
        return [float(rng.randint(10, 900)) for _ in range(q)]
    return [rng.uniform(10, 900) for _ in range(q)]


def _budget(kind: str, L: Sequence[float], n_min: int, n_max: int, rng: random.Random) -> float:
    """at: exactly the cost of some allocation; between: halfway between two adjacent feasible costs."""
    costs = sorted({_exact_cost(L, n) for n in itertools.product(range(n_min, n_max + 1), repeat=len(L))})
    inner = costs[1:-1] or costs
    if kind == "at":
        return float(rng.choice(inner))
    i = rng.randrange(len(costs) - 1)
    return float((costs[i] + costs[i + 1]) / 2)


def _instances(seed: int, count: int):
    rng = random.Random(seed)
    for i in range(count):
        q = rng.randint(2, 5)
        n_min, n_max = rng.choice([(1, 4), (1, 5), (2, 5)] if q <= 4 else [(1, 4), (2, 5)])
        L = _lengths(q, rng)
        kind = ("equal", "near", "ratio", "random")[i % 4]
        scale = (1e-6, 1.0, 1e6)[(i // 4) % 3]
        s = _signals(kind, q, scale, L, rng)
        B = _budget(("at", "between")[(i // 12) % 2], L, n_min, n_max, rng)
        yield s, L, B, n_min, n_max


def _check(s, L, B, n_min, n_max) -> Optional[str]:
    """None if the allocator returns the optimum (by the tie rule) within B, else what went wrong."""
    want = _brute_force(s, L, B, n_min, n_max)
    try:
        got = knapsack_allocation(s, L, B, n_min=n_min, n_max=n_max)
    except BudgetError as e:
        return f"raised {e}" if want is not None else None
    if want is None:
        return f"returned {got.n} but nothing fits"
    obj, cost = _exact_objective(s, got.n), _exact_cost(L, got.n)
    if cost > Fraction(B):
        return f"n={got.n} costs {float(cost)} > B={B}"
    if obj != want[0]:
        return f"n={got.n} objective {float(obj)!r} vs optimum {float(want[0])!r} at n={want[2]} (rel gap " \
               f"{float((obj - want[0]) / want[0]):.3g})"
    if (cost, tuple(got.n)) != want[1:]:
        return f"tie rule: n={got.n} (cost {float(cost)}) instead of n={want[2]} (cost {float(want[1])})"
    return None


@pytest.mark.parametrize("seed", [101, 202, 303])
def test_exact_allocator_matches_brute_force_with_near_ties(seed):
    """120 instances per seed: equal, nearly equal (1e-8..1e-6 relative), marginal-gain-tied and random
    signals, at scales 1e-6, 1 and 1e6, budgets exactly at a feasible cost and between two of them."""
    bad = []
    for s, L, B, n_min, n_max in _instances(seed, 120):
        problem = _check(s, L, B, n_min, n_max)
        if problem:
            bad.append(f"s={s} L={L} B={B!r} n in [{n_min}, {n_max}]: {problem}")
    assert not bad, f"{len(bad)} of 120 instances not optimal:\n" + "\n".join(bad[:5])


def test_exact_allocator_matches_a_dp_over_costs_on_medium_instances():
    """12-16 prompts (too many to enumerate) with integer lengths: the optimum of a DP over integer
    costs, exactly, including equal and nearly equal signals."""
    rng = random.Random(7)
    for i in range(24):
        q = rng.randint(12, 16)
        L = [float(rng.randint(5, 40)) for _ in range(q)]
        s = _signals(("equal", "near", "ratio", "random")[i % 4], q, (1e-6, 1.0, 1e6)[i % 3], L, rng)
        B = float(rng.randint(int(1.5 * sum(L)), int(5 * sum(L))))
        got = knapsack_allocation(s, L, B, n_min=1, n_max=8)
        assert _exact_cost(L, got.n) <= B
        assert _exact_objective(s, got.n) == _dp_over_costs(s, L, B, 1, 8), (s, L, B, got.n)


def test_exact_allocator_is_fast_on_a_training_sized_step():
    """256 prompts, n in [1, 32], running-mean lengths: solved well within a step's time, and no worse
    than the bisection allocation (which is feasible, so the optimum can only be better or equal)."""
    rng = random.Random(11)
    for kind in ("random", "near", "equal"):
        L = [rng.uniform(50, 4000) for _ in range(256)]
        s = _signals(kind, 256, 1.0, L, rng)
        B = 8 * sum(L) * rng.uniform(0.3, 0.9)
        t0 = time.perf_counter()
        got = knapsack_allocation(s, L, B, n_min=1, n_max=32)
        elapsed = time.perf_counter() - t0
        approx = bisect_allocation(s, L, B, n_min=1, n_max=32)
        assert _exact_cost(L, got.n) <= B
        assert _exact_objective(s, got.n) <= _exact_objective(s, approx.n)
        assert elapsed < 10.0, f"{kind}: {elapsed:.1f}s"


def test_exact_allocator_is_deterministic_on_exact_ties():
    """Four identical prompts and room for exactly one extra rollout: four optimal allocations; the tie
    rule picks the lexicographically smallest, [1, 1, 1, 2]."""
    got = knapsack_allocation([0.3] * 4, [100.0] * 4, 500.0, n_min=1, n_max=4)
    assert got.n == [1, 1, 1, 2] and got.cost == 500.0


def test_exact_allocator_flags_instead_of_claiming_optimality_when_out_of_time():
    """64 prompts whose gains per token all tie (to 1e-8..1e-6) at the break: choosing which of them get
    the extra rollout is a subset-sum over float lengths, which the exact search cannot finish in a
    second. It must not return an allocation as proven optimal: it falls back to the LP relaxation's
    (tests/methods/test_duet_lp_fallback.py) and says so (`fallback`)."""
    rng = random.Random(5)
    L = [rng.uniform(50, 4000) for _ in range(64)]
    s = _signals("ratio", 64, 1.0, L, rng)
    B = 0.6 * 8 * sum(L)
    t0 = time.perf_counter()
    got = knapsack_allocation(s, L, B, n_min=1, n_max=32, time_limit_s=1.0)
    assert got.fallback and _exact_cost(L, got.n) <= B
    assert time.perf_counter() - t0 < 10.0
