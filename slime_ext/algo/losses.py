"""Per-token policy-gradient terms and how they are reduced to one loss.

All functions take same-shaped per-token tensors (padded `[B, T]` or packed `[1, N]`); `mask` is the
float loss mask (0 = do not train), so prompt, padding, aborted and foreign-author tokens drop out.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch

KLEstimator = Literal["k1", "k2", "k3", "low_var_kl"]
Aggregation = Literal["token_mean", "sample_mean"]


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate `max(-A r, -A clip(r, 1-eps_low, 1+eps_high))` and a clipped flag.

    Separate low/high epsilons give DAPO's asymmetric clip ("clip-higher").
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    return loss, (clipped > unclipped).float()


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLEstimator = "low_var_kl") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled by pi.

    k1 = log(pi/ref); k2 = 0.5 log(pi/ref)^2; k3 = ref/pi - 1 - log(ref/pi) (unbiased, always >= 0);
    low_var_kl = k3 with the log-ratio clamped to [-20, 20] and the result to [-10, 10] for stability.
    """
    log_ratio = logprobs - ref_logprobs
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        neg = -log_ratio
        return torch.exp(neg) - 1.0 - neg
    if kind == "low_var_kl":
        neg = torch.clamp(-log_ratio, -20.0, 20.0)
        return torch.clamp(torch.exp(neg) - 1.0 - neg, -10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; expected k1, k2, k3 or low_var_kl")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution over the last dimension."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: Aggregation = "token_mean",
    seq_index: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Reduce per-token values to a scalar.

    token_mean: sum(v m) / sum(m) over the whole batch (long responses weigh more).
    sample_mean: mean over samples of each sample's sum(v m) / sum(m); samples with no trained token
    are left out. Rows are samples unless `seq_index` (packed layouts) maps positions to samples.
    An all-zero mask gives 0 (with a gradient path), never NaN.
    """
    mask = mask.to(values.dtype)
    if mode == "token_mean":
        return (values * mask).sum() / mask.sum().clamp(min=1e-8)
    if mode != "sample_mean":
        raise ValueError(f"unknown loss aggregation {mode!r}; expected token_mean or sample_mean")
    if seq_index is None:
        per_sum = (values * mask).sum(dim=-1).reshape(-1)
        per_cnt = mask.sum(dim=-1).reshape(-1)
    else:
        n = int(seq_index.max().item()) + 1 if seq_index.numel() else 0
        idx = seq_index.clamp(min=0).reshape(-1)
        valid = (seq_index >= 0).reshape(-1).to(values.dtype)
        flat_v = (values * mask).reshape(-1) * valid
        flat_m = mask.reshape(-1) * valid
        per_sum = torch.zeros(n, dtype=values.dtype).index_add(0, idx, flat_v)
        per_cnt = torch.zeros(n, dtype=values.dtype).index_add(0, idx, flat_m)
    has_tokens = per_cnt > 0
    if not bool(has_tokens.any()):
        return (values * mask).sum()
    return (per_sum[has_tokens] / per_cnt[has_tokens]).mean()


def grpo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    weights: Optional[torch.Tensor] = None,
    ref_logprobs: Optional[torch.Tensor] = None,
    entropy: Optional[torch.Tensor] = None,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "low_var_kl",
    entropy_coef: float = 0.0,
    loss_agg: Aggregation = "token_mean",
    seq_index: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO objective: clipped surrogate (x per-sample weight) + kl_coef KL - entropy_coef H.

    `advantages` and `weights` are per token (broadcast per-sample values with `RolloutBatch.per_token`).
    Weights scale the policy-gradient term only (DUET's importance weights), not the regularisers.
    """
    pg, clipped = ppo_clip_loss(logprobs, old_logprobs, advantages, eps_low, eps_high)
    if weights is not None:
        pg = pg * weights
    loss = aggregate(pg, mask, loss_agg, seq_index)
    metrics = {
        "pg_loss": float(loss.detach()),
        "clip_frac": float(aggregate(clipped, mask, "token_mean")),
        "approx_kl_old": float(aggregate(kl_penalty(logprobs.detach(), old_logprobs, "k3"), mask, "token_mean")),
    }
    if kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 but no reference logprobs were given")
        kl = aggregate(kl_penalty(logprobs, ref_logprobs, kl_estimator), mask, loss_agg, seq_index)
        loss = loss + kl_coef * kl
        metrics["kl_ref"] = float(kl.detach())
    if entropy is not None:
        ent = aggregate(entropy, mask, loss_agg, seq_index)
        metrics["entropy"] = float(ent.detach())
        if entropy_coef > 0:
            loss = loss - entropy_coef * ent
    metrics["loss"] = float(loss.detach())
    return loss, metrics
