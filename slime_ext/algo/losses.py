"""Per-token policy-gradient terms and how they are reduced to one loss.

All functions take same-shaped per-token tensors (padded `[B, T]`); `mask` is the
float loss mask (0 = do not train), so prompt, padding, aborted and foreign-author tokens drop out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import torch

KLEstimator = Literal["k1", "k2", "k3", "low_var_kl"]
Aggregation = Literal["token_mean", "sample_mean"]


@dataclass(frozen=True)
class LossSpec:
    """What a method asks of the trainer's policy loss. Per-token weights (Tandem's author weights, masks of
    dropped groups) are already folded into each sample's `loss_mask`; the KL reference is the run's
    starting checkpoint unless the method names another model (`Method.kl_reference_dir`)."""

    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    kl_coef: float = 0.0
    kl_estimator: str = "low_var_kl"
    entropy_coef: float = 0.0
    loss_agg: str = "token_mean"


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


def loss_coefficients(
    mask: torch.Tensor,
    mode: Aggregation = "token_mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token coefficients c and a denominator D such that the aggregate is `sum(c * v) / D`.

    token_mean: c = mask, D = sum(mask). sample_mean: c = mask / (trained tokens of the token's sample),
    D = number of samples with a trained token. Splitting the two lets a trainer that sees the batch in
    micro-batches (and data-parallel shards) use the global D and still get exactly this aggregate.
    Rows are samples.
    """
    mask = mask.float()
    if mode == "token_mean":
        return mask, mask.sum()
    if mode != "sample_mean":
        raise ValueError(f"unknown loss aggregation {mode!r}; expected token_mean or sample_mean")
    per_cnt = mask.sum(dim=-1, keepdim=True)
    coef = mask / per_cnt.clamp(min=1e-8)
    return coef, (per_cnt > 0).float().sum()


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: Aggregation = "token_mean",
) -> torch.Tensor:
    """Reduce per-token values to a scalar.

    token_mean: sum(v m) / sum(m) over the whole batch (long responses weigh more).
    sample_mean: mean over samples of each sample's sum(v m) / sum(m); samples with no trained token
    are left out. An all-zero mask gives 0 (with a gradient path), never NaN.
    """
    coef, denom = loss_coefficients(mask.to(values.dtype), mode)
    return (values * coef.to(values.dtype)).sum() / denom.clamp(min=1e-8)


def grpo_per_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: Optional[torch.Tensor] = None,
    ref_logprobs: Optional[torch.Tensor] = None,
    entropy: Optional[torch.Tensor] = None,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "low_var_kl",
    entropy_coef: float = 0.0,
    mismatch_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO objective per token, before aggregation, and its per-token parts (for metrics).

    loss_t = w * m_t * clip_surrogate_t + kl_coef * KL_t - entropy_coef * H_t. The method's weights w
    (DUET's importance weights, per sample) and the train-inference mismatch weights m_t
    (`slime_ext.algo.mismatch`) scale the policy-gradient term only, not the regularisers; they multiply.
    `clip_frac_low` / `clip_frac_high` count tokens whose surrogate the clip replaced below 1 - eps_low
    (negative advantage) and above 1 + eps_high (positive advantage).
    """
    pg, clipped = ppo_clip_loss(logprobs, old_logprobs, advantages, eps_low, eps_high)
    if weights is not None:
        pg = pg * weights
    if mismatch_weights is not None:
        pg = pg * mismatch_weights
    above = (logprobs.detach() > old_logprobs).float()
    parts = {"pg_loss": pg.detach(), "clip_frac": clipped, "clip_frac_low": clipped * (1.0 - above),
             "clip_frac_high": clipped * above, "approx_kl_old": kl_penalty(logprobs.detach(), old_logprobs, "k3")}
    loss = pg
    if kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 but no reference logprobs were given")
        kl = kl_penalty(logprobs, ref_logprobs, kl_estimator)
        loss = loss + kl_coef * kl
        parts["kl_ref"] = kl.detach()
    if entropy is not None:
        parts["entropy"] = entropy.detach()
        if entropy_coef > 0:
            loss = loss - entropy_coef * entropy
    return loss, parts
