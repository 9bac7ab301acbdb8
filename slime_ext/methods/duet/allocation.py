"""DUET's per-step rollout allocation (docs/methods/duet.md): how many rollouts each prompt gets.

Neyman allocation under a token budget B: minimise sum_q s_q^2 / n_q subject to sum_q n_q L_q <= B.
The continuous optimum (Theorem 1) is n_q = (B / S) s_q / sqrt(L_q), S = sum_k s_k sqrt(L_k), with
dual variable lambda = (S / B)^2, i.e. n_q = s_q / sqrt(lambda L_q). The practical allocator rounds and
clips n_q(lambda) to [n_min, n_max] and finds lambda by bisection on log lambda (warm-started from the
previous step); the exact allocator solves the integer problem as a multiple-choice knapsack in exact
integer arithmetic (exact_knapsack.py) and, past its time limit, falls back to the LP relaxation and the
best integral allocation found (lp_fallback.py), marking the Allocation (`fallback`).

Pitfall of the reference code avoided here: it bisects over a fixed range [e^-20, e^20], which at the
cold-start floor s = 0.01 does not contain the crossing, so it returns an allocation that spends only
62-75% of B. We widen the bracket until it straddles the crossing, saturate at n_max when everything
fits, and always return the side of the bracket that stays within B.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Sequence

import numpy as np

from slime_ext.methods.duet.exact_knapsack import ExactAllocationError, ExactSearchTimeout, solve_exact
from slime_ext.methods.duet.lp_fallback import lp_fallback

log = logging.getLogger("slime_ext.methods.duet")


class BudgetError(ValueError):
    """The budget cannot pay for n_min rollouts of every prompt."""


@dataclass
class Allocation:
    n: list[int]  # rollouts per prompt (integers; `n_real` holds the unrounded values)
    lam: float  # the dual variable that produced it (inf when only n_min fits, 0 when all saturate)
    cost: float  # sum n_q L_q
    budget: float
    saturated: bool = False  # every prompt at n_max (the budget was not binding)
    n_real: Optional[list[float]] = None
    iterations: int = 0
    fallback: bool = False  # the exact search ran out of time: the LP relaxation's allocation (lp_fallback.py)
    lp_objective: Optional[float] = None  # with `fallback`: the LP optimum of sum s^2 / n, a lower bound


def closed_form(s: Sequence[float], L: Sequence[float], budget: float) -> tuple[np.ndarray, float]:
    """Theorem 1: the continuous optimum (n_q, lambda) without rounding or clipping."""
    s_arr, L_arr = np.asarray(s, dtype=np.float64), np.asarray(L, dtype=np.float64)
    S = float(np.sum(s_arr * np.sqrt(L_arr)))
    return budget / S * s_arr / np.sqrt(L_arr), (S / budget) ** 2


def _check_inputs(s: Sequence[float], L: Sequence[float], budget: float, n_min: int, n_max: int,
                  floor: bool = True) -> tuple[np.ndarray, np.ndarray]:
    s_arr, L_arr = np.asarray(s, dtype=np.float64), np.asarray(L, dtype=np.float64)
    if s_arr.shape != L_arr.shape or s_arr.ndim != 1 or s_arr.size == 0:
        raise ValueError(f"allocation needs equal-length non-empty s and L (got {s_arr.shape} and {L_arr.shape})")
    if np.any(s_arr <= 0) or np.any(L_arr <= 0):
        raise ValueError("allocation needs s_q > 0 (apply the floor) and L_q > 0 for every prompt")
    if not 1 <= n_min <= n_max:
        raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
    floor_cost = n_min * float(L_arr.sum())
    if floor and floor_cost > budget:
        raise BudgetError(f"budget B={budget:.0f} tokens cannot cover n_min={n_min} rollout(s) of each of the "
                          f"{s_arr.size} prompts (that needs {floor_cost:.0f}); raise the budget or lower n_min")
    return s_arr, L_arr


def _n_of(lam_log: float, s: np.ndarray, L: np.ndarray, n_min: int, n_max: int, integer: bool) -> np.ndarray:
    raw = s / np.sqrt(math.exp(lam_log) * L)
    if integer:
        raw = np.rint(raw)
        return np.clip(raw, n_min, n_max)
    return raw


def bisect_allocation(s: Sequence[float], L: Sequence[float], budget: float, n_min: int = 1, n_max: int = 32,
                      iterations: int = 10, lam_init: Optional[float] = None, integer: bool = True) -> Allocation:
    """n_q(lambda) = clip(round(s_q / sqrt(lambda L_q)), n_min, n_max) with sum n_q L_q <= B.

    The bracket [lo, hi] on log lambda starts around `lam_init` (the previous step's lambda) and is
    widened until cost(lo) > B >= cost(hi); `iterations` halvings follow and the `hi` side (within B)
    is returned. `integer=False` drops rounding and clipping (for checking against Theorem 1).
    """
    s_arr, L_arr = _check_inputs(s, L, budget, n_min, n_max, floor=integer)

    def cost(x: float) -> float:
        return float(np.sum(_n_of(x, s_arr, L_arr, n_min, n_max, integer) * L_arr))

    if integer and n_max * float(L_arr.sum()) <= budget:  # everything fits: no bisection needed
        n = [n_max] * len(s_arr)
        return Allocation(n, 0.0, n_max * float(L_arr.sum()), budget, saturated=True, n_real=[float(x) for x in n])
    centre = math.log(lam_init) if lam_init and lam_init > 0 and math.isfinite(lam_init) else \
        2 * math.log(float(np.sum(s_arr * np.sqrt(L_arr))) / budget)  # Theorem 1's lambda as a cold guess
    lo, hi, width = centre - 1.0, centre + 1.0, 1.0
    while cost(lo) <= budget:  # lo must overspend
        width *= 2
        lo = centre - width
        if width > 2000:  # only possible when everything fits (handled above) or integer=False at lambda -> 0
            break
    width = 1.0
    while cost(hi) > budget:  # hi must fit
        width *= 2
        hi = centre + width
        if width > 2000:
            raise BudgetError(f"no lambda brings the allocation within B={budget:.0f} (n_min floor costs "
                              f"{n_min * float(L_arr.sum()):.0f})")
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if cost(mid) > budget:
            lo = mid
        else:
            hi = mid
    n_real = _n_of(hi, s_arr, L_arr, n_min, n_max, integer)
    n = [int(x) for x in np.rint(n_real)] if integer else [int(round(x)) for x in n_real]
    return Allocation(n, math.exp(hi), float(np.sum(n_real * L_arr)), budget, n_real=[float(x) for x in n_real],
                      iterations=iterations)


def knapsack_allocation(s: Sequence[float], L: Sequence[float], budget: float, n_min: int = 1, n_max: int = 32,
                        time_limit_s: float = 30.0) -> Allocation:
    """The exact integer allocation: a multiple-choice knapsack (one count per prompt), solved in exact
    integer arithmetic (exact_knapsack.py) because a tolerance-based solver (CBC, even at gap 0 with its
    preprocessing off) returned non-optimal allocations as Optimal when two allocations nearly tie.

    Among equally good allocations it returns the cheapest, then the lexicographically smallest n. The
    cost is summed exactly, so `cost <= budget` holds for the float values too. Past `time_limit_s` the
    search stops and the allocation is the LP relaxation's best integral one (lp_fallback.py), within B and
    [n_min, n_max] but not proven optimal: `fallback` is set and a warning logged."""
    s_arr, L_arr = _check_inputs(s, L, budget, n_min, n_max)
    if math.isinf(budget) or _exact_cost(L_arr, [n_max] * len(L_arr)) <= Fraction(budget):
        n = [n_max] * len(s_arr)
        return Allocation(n, 0.0, float(_exact_cost(L_arr, n)), budget, saturated=True)
    s_list, L_list = [float(x) for x in s_arr], [float(x) for x in L_arr]
    try:
        n = solve_exact(s_list, L_list, budget, n_min, n_max, time_limit_s)
    except ExactSearchTimeout as e:
        fb = lp_fallback(s_list, L_list, budget, n_min, n_max, incumbent=e.incumbent)
        gap = "" if fb.lp_objective is None else \
            f"; objective {objective(s_list, fb.n):.6g} against the LP bound {fb.lp_objective:.6g}"
        log.warning("DUET knapsack: %s; using the LP relaxation's allocation (%s%s)", e, fb.source, gap)
        return Allocation(fb.n, float("nan"), float(_exact_cost(L_arr, fb.n)), budget, fallback=True,
                          lp_objective=fb.lp_objective)
    except ExactAllocationError as e:
        raise BudgetError(f"knapsack allocation: {e} (B={budget:.0f})") from e
    return Allocation(n, float("nan"), float(_exact_cost(L_arr, n)), budget)


def _exact_cost(L: np.ndarray, n: Sequence[int]) -> Fraction:
    """sum_q n_q L_q without rounding (a float sum can round an overspend of one ulp down to B)."""
    return sum((k * Fraction(float(x)) for k, x in zip(n, L)), Fraction(0))


def objective(s: Sequence[float], n: Sequence[int]) -> float:
    """sum_q s_q^2 / n_q: the variance proxy the allocation minimises."""
    return float(sum(si * si / ni for si, ni in zip(s, n)))


def stratification_factors(counts: Sequence[int], eps_pre: float = 0.05) -> list[float]:
    """s_pre_q = clip(n_q / mean_q n_q, eps_pre, 1), from the counts actually rolled out (after any
    rounding or trimming), so the reweighting matches what was sampled."""
    if not counts:
        return []
    mean_n = sum(counts) / len(counts)
    return [min(1.0, max(eps_pre, c / mean_n)) for c in counts]
