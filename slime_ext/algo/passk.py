"""Sampling metrics: unbiased pass@k (Chen et al. 2021) and mean@k."""

from __future__ import annotations

from typing import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k draws is correct) from n samples with c correct.

    `1 - C(n-c, k) / C(n, k)`, evaluated as a stable product instead of huge binomials.
    """
    if not (0 <= c <= n) or k < 1 or k > n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def pass_at_k_over_prompts(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean pass@k over prompts, each given as (n samples, c correct)."""
    if not counts:
        raise ValueError("pass_at_k_over_prompts needs at least one prompt")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def mean_at_k(scores_per_prompt: Sequence[Sequence[float]], k: int) -> float:
    """Mean score of the first k samples of every prompt, averaged over prompts (expected accuracy)."""
    if not scores_per_prompt:
        raise ValueError("mean_at_k needs at least one prompt")
    total = 0.0
    for scores in scores_per_prompt:
        if len(scores) < k:
            raise ValueError(f"mean_at_k with k={k} but a prompt has only {len(scores)} samples")
        total += sum(scores[:k]) / k
    return total / len(scores_per_prompt)
