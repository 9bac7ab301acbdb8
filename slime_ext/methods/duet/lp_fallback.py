"""DUET's allocation when the exact search passes its time limit: the LP relaxation, solved by pulp (CBC), and
the best integral allocation found.

Why: the exact search (exact_knapsack.py) is exponential in the worst case (gains per token near-tied over
float lengths). Past its limit a step still needs an allocation; stopping the run for want of a proof of
optimality costs more than one step with a near-optimal allocation, which the step's metrics flag
(`duet/allocator_fallback`).

The relaxation. Above n_min, each prompt's unit increments (n -> n + 1: gain s_q^2 / (n (n + 1)), cost L_q)
are the items of a fractional knapsack of capacity B - n_min sum_q L_q. Gains per token fall strictly with n
inside a prompt, so an optimum takes each prompt's increments in order and its total per prompt is a
(fractional) count. Its objective bounds every integer allocation's objective from below.

The integral allocation is the better (more gain, then less cost, compared in the exact integers of
`integer_problem`) of
- the LP solution rounded down per prompt (cut back within B exactly if the solver's tolerance overspent),
  then filled greedily by gain per token with the increments that still fit;
- the greedy fill from n_min everywhere (the exact search's incumbent): it takes every increment the LP takes
  whole, in the same order, up to the first that does not fit, so it falls short of the LP optimum by less
  than that one increment's gain (Dantzig's bound). That bound holds whatever CBC returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from slime_ext.methods.duet.exact_knapsack import IntegerProblem, greedy_fill, integer_problem

ROUND_TOLERANCE = 1e-6  # a count CBC returns as 2.9999997 is 3 increments; rounding down then keeps them


@dataclass(frozen=True)
class FallbackAllocation:
    n: list[int]  # rollouts per prompt, within B and [n_min, n_max]
    lp_objective: Optional[float]  # sum_q s_q^2 / n_q at the LP optimum (None when CBC returned no optimum)
    source: str  # the candidate that won: "lp_rounding" or "greedy"


def lp_counts(problem: IntegerProblem, time_limit_s: float) -> Optional[list[float]]:
    """Per prompt, the LP relaxation's (fractional) number of increments above n_min, solved by CBC; None when
    it returns no optimal solution. Gains and costs are scaled to at most 1 so that CBC's absolute tolerances
    act on numbers of order 1 (signals down to 1e-9 make raw gains of 1e-18)."""
    import pulp  # only a step that falls back needs the solver

    if problem.capacity == 0:
        return [0.0] * len(problem.gains)
    top = max((g[1] - g[0] for g in problem.gains if len(g) > 1), default=0) or 1
    lp = pulp.LpProblem("duet_allocation_relaxation", pulp.LpMaximize)
    variables, gain_terms, cost_terms = [], [], []
    for q, (gains, costs) in enumerate(zip(problem.gains, problem.costs)):
        row = [pulp.LpVariable(f"x_{q}_{i}", 0, 1) for i in range(len(gains) - 1)]
        gain_terms += [(x, (gains[i + 1] - gains[i]) / top) for i, x in enumerate(row)]
        cost_terms += [(x, (costs[i + 1] - costs[i]) / problem.capacity) for i, x in enumerate(row)]
        variables.append(row)
    lp += pulp.LpAffineExpression(gain_terms)
    lp += pulp.LpAffineExpression(cost_terms) <= 1
    lp.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=max(1, math.ceil(time_limit_s))))
    if pulp.LpStatus[lp.status] != "Optimal":
        return None
    return [sum(x.value() or 0.0 for x in row) for row in variables]


def round_down(problem: IntegerProblem, counts: Sequence[float]) -> list[int]:
    """The LP counts rounded down to option indices, then cut within the capacity in exact arithmetic (the last
    increment of the lowest gain per token first) if the solver's tolerance overspent."""
    chosen = [min(len(g) - 1, max(0, math.floor(c + ROUND_TOLERANCE))) for g, c in zip(problem.gains, counts)]
    spent = sum(c[i] for c, i in zip(problem.costs, chosen))
    while spent > problem.capacity:
        q = min((q for q in range(len(chosen)) if chosen[q] > 0), key=lambda q: _last_increment(problem, chosen, q))
        spent -= problem.costs[q][chosen[q]] - problem.costs[q][chosen[q] - 1]
        chosen[q] -= 1
    return chosen


@dataclass(frozen=True)
class _Ratio:
    """gain / cost, compared exactly by cross-multiplying (cost > 0)."""

    gain: int
    cost: int

    def __lt__(self, other: "_Ratio") -> bool:
        return self.gain * other.cost < other.gain * self.cost


def _last_increment(problem: IntegerProblem, chosen: Sequence[int], q: int) -> _Ratio:
    """Gain per token of prompt q's last increment taken."""
    i, gains, costs = chosen[q], problem.gains[q], problem.costs[q]
    return _Ratio(gains[i] - gains[i - 1], costs[i] - costs[i - 1])


def lp_fallback(s: Sequence[float], L: Sequence[float], budget: float, n_min: int, n_max: int,
                incumbent: Optional[Sequence[int]] = None, time_limit_s: float = 10.0) -> FallbackAllocation:
    """The allocation of the module docstring. `incumbent`: the exact search's greedy allocation (n per prompt),
    recomputed here when not given. The caller has checked that n_min everywhere fits and n_max does not."""
    problem = integer_problem(s, L, budget, n_min, n_max)
    greedy = [k - n_min for k in incumbent] if incumbent is not None else \
        greedy_fill(problem, [0] * len(problem.gains))[0]
    candidates = {"greedy": greedy}
    counts = lp_counts(problem, time_limit_s)
    if counts is not None:
        candidates["lp_rounding"] = greedy_fill(problem, round_down(problem, counts))[0]

    def rank(name: str) -> tuple[int, int]:
        chosen = candidates[name]
        return (sum(g[i] for g, i in zip(problem.gains, chosen)), -sum(c[i] for c, i in zip(problem.costs, chosen)))

    best = max(sorted(candidates), key=rank)
    lp_objective = None if counts is None else sum(_value(x, n_min + c) for x, c in zip(s, counts))
    return FallbackAllocation([n_min + i for i in candidates[best]], lp_objective, best)


def _value(s: float, n: float) -> float:
    """s^2 / n interpolated linearly between the integers around n: the LP's objective term of one prompt."""
    k = math.floor(n + ROUND_TOLERANCE)
    frac = max(0.0, n - k)
    return s * s / k - frac * (s * s / k - s * s / (k + 1))
