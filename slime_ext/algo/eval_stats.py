"""Uncertainty of evaluation numbers: standard errors over prompts and paired bootstrap intervals.

Two models evaluated on the same prompts are compared prompt by prompt (a paired design): the difference
of their per-prompt scores has a much smaller spread than either score, because easy prompts are easy
for both. The interval is scipy's percentile bootstrap over prompts with `paired=True`, with a fixed seed
so a table is reproducible. A difference whose interval contains zero is reported as "no measured
difference" by `describe_difference`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

CONFIDENCE = 0.95
N_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


@dataclass(frozen=True)
class PairedDifference:
    """`mean` of b - a over n prompts, its standard error and a bootstrap interval (all in score units)."""

    mean: float
    stderr: float
    ci_low: float
    ci_high: float
    n: int
    confidence: float = CONFIDENCE

    @property
    def measured(self) -> bool:
        """True when the interval excludes zero (a difference the evaluation can tell from noise)."""
        return self.ci_low > 0 or self.ci_high < 0


def stderr_over_prompts(values: Sequence[float]) -> float:
    """Standard error of the mean of per-prompt values (sample standard deviation / sqrt(n)); 0 for n < 2."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return 0.0
    return float(x.std(ddof=1) / math.sqrt(x.size))


def paired_difference(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE,
                      n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> PairedDifference:
    """Difference b - a of per-prompt scores of two models on the same prompts (same order)."""
    from scipy.stats import bootstrap

    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired scores need two equal-length 1-D sequences, got shapes {x.shape} and {y.shape}")
    if x.size == 0:
        raise ValueError("paired scores need at least one prompt")
    d = y - x
    mean = float(d.mean())
    if x.size < 2 or np.all(d == d[0]):
        return PairedDifference(mean, 0.0 if x.size >= 2 else float("nan"), mean if x.size >= 2 else float("nan"),
                                mean if x.size >= 2 else float("nan"), int(x.size), confidence)
    res = bootstrap((x, y), lambda p, q, axis=-1: np.mean(q - p, axis=axis), paired=True, vectorized=True,
                    confidence_level=confidence, n_resamples=n_resamples, method="percentile",
                    rng=np.random.default_rng(seed))
    ci = res.confidence_interval
    return PairedDifference(mean, stderr_over_prompts(d), float(ci.low), float(ci.high), int(x.size), confidence)


def describe_difference(diff: PairedDifference, scale: float = 100.0, unit: str = "points", digits: int = 1) -> str:
    """`+2.9 ± 1.1 (95% CI +0.8 to +5.0)`, or the same followed by "no measured difference" when the
    interval contains zero; `digits` decimals (more for metrics whose differences are fractions of a unit)."""
    d = digits
    text = (f"{scale * diff.mean:+.{d}f} ± {scale * diff.stderr:.{d}f} {unit} "
            f"({100 * diff.confidence:.0f}% CI {scale * diff.ci_low:+.{d}f} to {scale * diff.ci_high:+.{d}f})")
    return text if diff.measured else text + ", no measured difference"
