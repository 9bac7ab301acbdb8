"""Intervals for study claims: paired over prompts within one run, t over seeds across runs."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
from scipy import stats

__all__ = ["t_interval", "paired_over_prompts", "min_detectable_difference", "ci_text"]


def t_interval(values: Sequence[float], level: float = 0.95) -> dict:
    """Mean, standard error and t interval (n - 1 degrees of freedom) of per-seed values; with one value the
    spread is unknown and se / ci95 are None (a claim from one seed has no interval)."""
    v = np.asarray(values, float)
    if len(v) == 0:
        raise ValueError("t_interval needs at least one value")
    if len(v) < 2:
        return {"mean": float(v.mean()), "se": None, "ci95": None, "n": 1}
    se = float(v.std(ddof=1) / math.sqrt(len(v)))
    h = float(stats.t.ppf(0.5 + level / 2, len(v) - 1) * se)
    return {"mean": float(v.mean()), "se": se, "ci95": [float(v.mean() - h), float(v.mean() + h)], "n": len(v)}


def paired_over_prompts(a: Mapping[str, float], b: Mapping[str, float]) -> dict:
    """a - b over the prompts both evaluated (each prompt's mean score): mean difference, its standard error
    over prompts and a normal 95% interval. Pairing removes the prompts' own difficulty from the noise."""
    keys = sorted(set(a) & set(b))
    if len(keys) < 2:
        raise ValueError(f"paired_over_prompts needs at least 2 shared prompts, got {len(keys)}")
    d = np.array([a[k] - b[k] for k in keys])
    se = float(d.std(ddof=1) / math.sqrt(len(d)))
    mean = float(d.mean())
    return {"diff": mean, "se": se, "ci95": [mean - 1.96 * se, mean + 1.96 * se], "n_prompts": len(keys)}


def min_detectable_difference(seed_sd: float, n_per_arm: int, level: float = 0.95) -> float:
    """Half-width of the t interval of a difference between two arms of ``n_per_arm`` seeds each whose results
    spread with standard deviation ``seed_sd`` between seeds (Welch-like with equal variances, 2n - 2 degrees
    of freedom): a difference smaller than this is inside the noise floor."""
    if n_per_arm < 2:
        raise ValueError("n_per_arm must be >= 2")
    return float(stats.t.ppf(0.5 + level / 2, 2 * n_per_arm - 2) * seed_sd * math.sqrt(2 / n_per_arm))


def ci_text(d: dict, scale: float = 100.0, unit: str = "", digits: int = 1) -> str:
    """`+1.2 ± 0.4 [+0.3, +2.1]` for a `t_interval` (or `paired_over_prompts`) result, with "(no measured
    difference)" when the interval contains 0 and "(one seed)" without one. `digits`: decimals (two for a metric
    such as think blocks, whose differences are fractions of one)."""
    mean = d["mean"] if "mean" in d else d["diff"]
    if d.get("ci95") is None:
        return f"{scale * mean:+.{digits}f}{unit} (one seed)"
    lo, hi = d["ci95"]
    verdict = "" if lo > 0 or hi < 0 else " (no measured difference)"
    return (f"{scale * mean:+.{digits}f}{unit} ± {scale * d['se']:.{digits}f} "
            f"[{scale * lo:+.{digits}f}, {scale * hi:+.{digits}f}]{verdict}")
