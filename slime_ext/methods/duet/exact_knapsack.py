"""The exact integer allocation behind `duet.allocator: knapsack`, in exact integer arithmetic.

Problem: minimise sum_q s_q^2 / n_q subject to sum_q n_q L_q <= B and n_min <= n_q <= n_max (integers),
a multiple-choice knapsack with one class per prompt. An LP/MIP solver decides "better" with absolute
tolerances, and with near-ties (allocations whose objectives differ by 1e-8 relative) CBC returned
non-optimal allocations as Optimal. Here no tolerance exists anywhere:

1. Scale to integers. Every float is a dyadic rational, so s_q^2, L_q and B are exact rationals. Costs
   become integers over the common power-of-two denominator of the L_q (the budget is floored onto that
   grid, which keeps exactly the same feasible set); objective terms s_q^2 / n become integers over the
   denominator of the s_q^2 times lcm(n_min..n_max). Python ints do not overflow.
2. Bound. Work with the gain over n_min (gain_q(n) = value(n_min) - value(n), cost_q(n) = (n - n_min) L_q).
   A greedy pass over the unit increments by decreasing gain per token gives a feasible incumbent z and
   the break ratio r = p_b / w_b (the LP relaxation's dual price). For any feasible allocation,
   gain <= r R + sum_q (gain_q(n_q) - r cost_q(n_q)) (Lagrangian bound, valid for every r >= 0).
3. Reduce. An option of a prompt whose Lagrangian bound (the other prompts at their best) is below z
   cannot be part of an allocation at least as good as z, so it is dropped; most prompts keep one option.
4. Dynamic program over the prompts with more than one option left, in index order, on Pareto states
   (cost, gain): a state is dropped when another costs at most as much with at least its gain, or when
   the LP relaxation of the prompts still to come cannot lift it to z.

Every comparison is between Python ints, so the result is optimal in exact arithmetic. Ties are broken
by a fixed rule: the smallest objective, then the smallest planned cost, then the lexicographically
smallest n. The worst case is exponential (the problem is NP-hard): when many prompts' gains per token
tie at the break (to ~1e-6) choosing which of them get one more rollout is a subset-sum over float
lengths (24 such prompts can take over 20 s on one core). A deadline turns that into ExactSearchTimeout,
never into a silently non-optimal allocation; the caller decides what to do instead (allocation.py falls back
to the LP relaxation and flags the step, lp_fallback.py). Training-sized steps with ordinary signals (256
prompts, n in [1, 32]) take about a second.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_right, insort
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Sequence


class ExactAllocationError(ValueError):
    """The budget cannot pay for n_min rollouts of every prompt, or the search ran out of time."""


class ExactSearchTimeout(ExactAllocationError):
    """The search passed its time limit before proving an allocation optimal. `incumbent` is the greedy
    allocation (n per prompt) it had found by then, feasible but not proven optimal (None if none yet)."""

    def __init__(self, message: str, incumbent: Optional[list[int]] = None):
        super().__init__(message)
        self.incumbent = incumbent


@dataclass(frozen=True)
class IntegerProblem:
    """The allocation in integers: gains[q][i] and costs[q][i] for n = n_min + i, capacity R."""

    gains: list[list[int]]
    costs: list[list[int]]
    capacity: int
    n_min: int


@dataclass
class _Stage:
    """One DP stage (a prompt with several options): per surviving state, its parent's index in the
    previous stage and the option it took."""

    prompt: int
    parents: list[int]
    options: list[int]


def _dyadic_denominator(values: Sequence[Fraction]) -> int:
    """The common denominator of exact floats (powers of two, so the largest one divides the others)."""
    return max(v.denominator for v in values)


def integer_problem(s: Sequence[float], L: Sequence[float], budget: float, n_min: int, n_max: int) -> IntegerProblem:
    """Step 1: the same problem with integer gains, costs and capacity (see the module docstring)."""
    squares = [Fraction(x) ** 2 for x in s]
    lengths = [Fraction(x) for x in L]
    den_s, den_l = _dyadic_denominator(squares), _dyadic_denominator(lengths)
    lcm_n = math.lcm(*range(n_min, n_max + 1))
    weights = [int(w * den_s) * lcm_n for w in squares]
    unit_costs = [int(x * den_l) for x in lengths]
    capacity = math.floor(Fraction(budget) * den_l) - n_min * sum(unit_costs)
    ns = range(n_min, n_max + 1)
    gains = [[w // n_min - w // n for n in ns] for w in weights]
    costs = [[(n - n_min) * c for n in ns] for c in unit_costs]
    return IntegerProblem(gains, costs, capacity, n_min)


def increments(problem: IntegerProblem) -> list[tuple[Fraction, int, int]]:
    """Unit increments (q, i -> i + 1) sorted by exact gain per token, best first; ties by (q, i).

    Gains per token fall with i inside a prompt (s^2 / n is convex), so this order takes each prompt's
    increments in sequence, and a greedy fill over it is a valid allocation."""
    items = []
    for q, (g, c) in enumerate(zip(problem.gains, problem.costs)):
        for i in range(len(g) - 1):
            items.append((Fraction(g[i + 1] - g[i], c[i + 1] - c[i]), q, i))
    items.sort(key=lambda t: (-t[0], t[1], t[2]))
    return items


def _greedy_and_price(problem: IntegerProblem) -> tuple[list[int], tuple[int, int]]:
    """Step 2: the greedy allocation (option indices) and the break item's (profit, weight)."""
    chosen, price = greedy_fill(problem, [0] * len(problem.gains))
    if price is None:
        raise AssertionError("the greedy fill took every increment: the caller handles saturation")
    return chosen, price


def greedy_fill(problem: IntegerProblem, start: Sequence[int]) -> tuple[list[int], Optional[tuple[int, int]]]:
    """From option indices `start` (within the capacity), add unit increments by decreasing gain per token
    while they fit; returns the options and the first increment that did not fit, as (profit, weight)
    (None when every one fitted).

    Skipping an increment that does not fit never breaks a prompt's sequence: its later increments cost
    the same tokens and the room only shrinks."""
    chosen = list(start)
    room = problem.capacity - sum(c[i] for c, i in zip(problem.costs, chosen))
    if room < 0:
        raise ValueError("greedy_fill: the start allocation is over the capacity")
    price = None
    for ratio, q, i in increments(problem):
        weight = problem.costs[q][i + 1] - problem.costs[q][i]
        if weight <= room and chosen[q] == i:
            chosen[q], room = i + 1, room - weight
        elif price is None and chosen[q] == i:
            price = (problem.gains[q][i + 1] - problem.gains[q][i], weight)
    return chosen, price


def _lagrangian_terms(problem: IntegerProblem, price: tuple[int, int]) -> list[list[int]]:
    """w_b * gain - p_b * cost per option: the Lagrangian bound's terms, scaled by w_b > 0 to stay integer."""
    p, w = price
    return [[w * g - p * c for g, c in zip(gs, cs)] for gs, cs in zip(problem.gains, problem.costs)]


def _reduce(problem: IntegerProblem, terms: list[list[int]], price: tuple[int, int], z: int) -> list[list[int]]:
    """Step 3: per prompt, the option indices whose bound (everyone else at their best term) reaches z."""
    p, w = price
    total = p * problem.capacity + sum(max(t) for t in terms)
    kept = []
    for q, t in enumerate(terms):
        others = total - max(t)
        kept.append([i for i, ti in enumerate(t) if others + ti >= w * z and problem.costs[q][i] <= problem.capacity])
    return kept


@dataclass
class _SuffixLP:
    """The LP relaxation of a set of prompts over their kept options, as a function of the room left:
    each prompt at its lowest kept option (base), then whole increments by decreasing gain per token
    (prefix sums), then a fraction of the next one."""

    base_cost: int
    base_gain: int
    weights: list[int]  # weights[t]: tokens of the best t increments (weights[0] = 0)
    profits: list[int]
    items: list[tuple[int, int]]  # (gain, tokens) of each increment, in that order

    def reaches(self, room: int, need: int) -> bool:
        """Whether the LP optimum with `room` tokens is at least `need`, compared exactly."""
        room, need = room - self.base_cost, need - self.base_gain
        if room < 0:
            return False
        t = bisect_right(self.weights, room) - 1
        if t == len(self.items):
            return self.profits[t] >= need
        p, w = self.items[t]  # profits[t] + (room - weights[t]) * p / w >= need, times w > 0
        return w * (self.profits[t] - need) + (room - self.weights[t]) * p >= 0


def _suffix_bounds(problem: IntegerProblem, kept: list[list[int]], free: list[int]) -> list[_SuffixLP]:
    """bounds[j]: the LP relaxation of free prompts j+1, j+2, ... (the ones a state after j has left).

    Kept options form an interval of a concave gain curve at linear cost, so the greedy order is valid."""
    bounds: list[_SuffixLP] = [_SuffixLP(0, 0, [0], [0], [])] * len(free)
    order: list[tuple[Fraction, int, int, int]] = []  # (-gain per token, prompt, option, ...) sorted
    base_cost = base_gain = 0
    for j in range(len(free) - 1, 0, -1):
        q = free[j]
        gs, cs, opts = problem.gains[q], problem.costs[q], kept[q]
        base_cost, base_gain = base_cost + cs[opts[0]], base_gain + gs[opts[0]]
        for a, b in zip(opts, opts[1:]):
            insort(order, (-Fraction(gs[b] - gs[a], cs[b] - cs[a]), q, a, b))
        items = [(problem.gains[r][b] - problem.gains[r][a], problem.costs[r][b] - problem.costs[r][a])
                 for _, r, a, b in order]
        weights, profits = [0], [0]
        for p, w in items:
            weights.append(weights[-1] + w)
            profits.append(profits[-1] + p)
        bounds[j - 1] = _SuffixLP(base_cost, base_gain, weights, profits, items)
    return bounds


def _dp(problem: IntegerProblem, z: int, kept: list[list[int]], deadline: float) -> list[int]:
    """Step 4: the optimum by the tie rule over the reduced options, as option indices per prompt."""
    fixed = [q for q, k in enumerate(kept) if len(k) == 1]
    free = [q for q, k in enumerate(kept) if len(k) > 1]
    bounds = _suffix_bounds(problem, kept, free)
    room = problem.capacity - sum(problem.costs[q][kept[q][0]] for q in fixed)
    need = z - sum(problem.gains[q][kept[q][0]] for q in fixed)
    states = [(0, 0)]  # (cost, gain) of the free prompts so far, in the lexicographic order of their choices
    stages: list[_Stage] = []
    for j, q in enumerate(free):
        try:
            states, stage = _extend(states, q, kept[q], problem, room, need, bounds[j], deadline)
        except TimeoutError as e:
            raise ExactSearchTimeout(f"exact allocation: no proof of optimality within the time limit ({e} at "
                                     f"undecided prompt {j + 1} of {len(free)})") from None
        stages.append(stage)
    best = max(range(len(states)), key=lambda k: (states[k][1], -states[k][0], -k))
    return _backtrack(problem, kept, stages, best)


def _extend(states: list[tuple[int, int]], q: int, options: list[int], problem: IntegerProblem, room: int,
            need: int, rest: _SuffixLP, deadline: float) -> tuple[list[tuple[int, int]], _Stage]:
    """One DP stage: every state times every option of prompt q, keeping those that fit and whose bound
    (the LP of the prompts left) still reaches the incumbent, then Pareto dominance (drop a state when
    another costs at most as much with at least its gain), equal (cost, gain) states merged into the
    lexicographically smallest. New states come out in lexicographic order of their choices. Raises
    TimeoutError past the deadline (checked every 1024 states, so a huge stage cannot overrun it)."""
    best: dict[tuple[int, int], tuple[int, int]] = {}  # (cost, gain) -> (parent, option), lex-smallest
    for parent, (cost, gain) in enumerate(states):  # parents in lex order, options ascending: first is smallest
        if parent % 1024 == 0 and time.monotonic() > deadline:
            raise TimeoutError(f"{len(states)} states")
        for i in options:
            c, g = cost + problem.costs[q][i], gain + problem.gains[q][i]
            if c <= room and (c, g) not in best and rest.reaches(room - c, need - g):
                best[(c, g)] = (parent, i)
    frontier, top = [], None
    for c, g in sorted(best, key=lambda cg: (cg[0], -cg[1])):
        if top is None or g > top:
            frontier.append((c, g))
            top = g
    frontier.sort(key=lambda cg: best[cg])  # (parent rank, option) is the lexicographic order of the choices
    stage = _Stage(q, [best[cg][0] for cg in frontier], [best[cg][1] for cg in frontier])
    return frontier, stage


def _backtrack(problem: IntegerProblem, kept: list[list[int]], stages: list[_Stage], index: int) -> list[int]:
    """Option indices per prompt: fixed prompts' single option, free prompts' from the DP's parent links."""
    chosen = [k[0] for k in kept]
    for stage in reversed(stages):
        chosen[stage.prompt] = stage.options[index]
        index = stage.parents[index]
    return chosen


def solve_exact(s: Sequence[float], L: Sequence[float], budget: float, n_min: int, n_max: int,
                time_limit_s: float = 30.0) -> list[int]:
    """The optimal n per prompt (tie rule in the module docstring). Raises ExactAllocationError when even
    n_min everywhere exceeds B, and ExactSearchTimeout (with the greedy incumbent) when the search has not
    finished after time_limit_s."""
    deadline = time.monotonic() + time_limit_s
    problem = integer_problem(s, L, budget, n_min, n_max)
    if problem.capacity < 0:
        raise ExactAllocationError(f"budget B={budget!r} cannot cover n_min={n_min} rollout(s) of each prompt")
    if sum(c[-1] for c in problem.costs) <= problem.capacity:
        return [n_max] * len(problem.gains)  # everything fits: n_max is the unique optimum (s_q > 0)
    greedy, price = _greedy_and_price(problem)
    z = sum(g[i] for g, i in zip(problem.gains, greedy))
    terms = _lagrangian_terms(problem, price)
    kept = _reduce(problem, terms, price, z)
    try:
        chosen = _dp(problem, z, kept, deadline)
    except ExactSearchTimeout as e:
        e.incumbent = [n_min + i for i in greedy]
        raise
    return [n_min + i for i in chosen]
