"""SxS optional reward shaping (paper appendix C), solved exactly.

For a group: l_i = longest think block of rollout i; targets S_i = -(l_i - mu) / sigma over the correct
rollouts (mu, sigma of their l), and -S_min for the incorrect ones: the paper's eq. 14, S_min > 0 a fixed
worst-case score (`sxs.s_min`, default 3: below any correct rollout's z-score in groups of up to 10,
whose |z| <= sqrt(G - 1)). Then

    min_R sum_i (R_i - S_i)^2   s.t.  R_i >= mean(R) + eps (correct),  R_i <= mean(R) - eps (incorrect).

Exact solution: at the optimum mean(R) = mean(S) =: m (the KKT stationarity conditions share one
multiplier shift t whose value forces it), and R_i(t) = max(S_i + t, m + eps) for correct,
min(S_i + t, m - eps) for incorrect, with t the root of mean(R(t)) = m. mean(R(t)) is continuous,
piecewise linear and non-decreasing in t, so the root is found exactly on its breakpoints.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def shaping_targets(longest_think: Sequence[float], correct: Sequence[bool], s_min: float = 3.0) -> np.ndarray:
    if s_min <= 0:
        raise ValueError(f"S_min must be > 0 (a worst-case score), got {s_min}")
    l = np.asarray(longest_think, dtype=np.float64)
    c = np.asarray(correct, dtype=bool)
    s = np.zeros_like(l)
    if c.any():
        mu, sigma = l[c].mean(), l[c].std()
        s[c] = -(l[c] - mu) / (sigma if sigma > 0 else 1.0)
        s[~c] = -float(s_min)
    return s


def solve_shaping_qp(targets: Sequence[float], correct: Sequence[bool], eps: float = 0.5) -> np.ndarray:
    """The exact minimiser (see the module docstring). Needs at least one correct and one incorrect."""
    s = np.asarray(targets, dtype=np.float64)
    c = np.asarray(correct, dtype=bool)
    if c.all() or not c.any():
        raise ValueError("shaping needs a mixed group (at least one correct and one incorrect rollout)")
    m = float(s.mean())

    def r_of(t: float) -> np.ndarray:
        return np.where(c, np.maximum(s + t, m + eps), np.minimum(s + t, m - eps))

    # breakpoints where a term switches between free and clamped: S_i + t = m +/- eps
    bps = np.sort(np.concatenate([m + eps - s[c], m - eps - s[~c]]))
    vals = np.array([r_of(t).mean() - m for t in bps])
    # g(t) = mean(R(t)) - m is non-decreasing; find the segment holding its root and solve it linearly
    if vals[0] >= 0:  # root at or left of the first breakpoint: the correct side is all clamped there
        lo, hi = bps[0] - 1.0, bps[0]
        while r_of(lo).mean() - m > 0:
            lo -= 2 * (hi - lo)
    elif vals[-1] <= 0:
        lo, hi = bps[-1], bps[-1] + 1.0
        while r_of(hi).mean() - m < 0:
            hi += 2 * (hi - lo)
    else:
        k = int(np.searchsorted(vals, 0.0))
        lo, hi = bps[k - 1], bps[k]
    g_lo, g_hi = r_of(lo).mean() - m, r_of(hi).mean() - m
    t = lo if g_hi == g_lo else lo + (0.0 - g_lo) * (hi - lo) / (g_hi - g_lo)
    return r_of(t)


def check_separation(rewards: Sequence[float], correct: Sequence[bool], eps: float = 0.5, tol: float = 1e-9) -> None:
    """Raise if shaped rewards break the correctness separation constraints."""
    r = np.asarray(rewards, dtype=np.float64)
    c = np.asarray(correct, dtype=bool)
    m = r.mean()
    bad = [i for i in range(len(r)) if (c[i] and r[i] < m + eps - tol) or (not c[i] and r[i] > m - eps + tol)]
    if bad:
        raise AssertionError(f"shaped rewards violate the separation constraints at rollouts {bad} (mean {m:.4f})")
