"""Train-inference mismatch: importance weights that correct for the engine not sampling from the trainer's policy.

The engine (bf16, other kernels, other MoE routing, or weights one version behind) samples token y with
probability pi_e(y); the trainer's policy at the same weights gives pi_old(y). The policy gradient is an
expectation under pi_old, so each token's term is weighted by r = pi_old / pi_e (computed in log space).

Three levels of r (per token, or one per sequence broadcast to its tokens):
- token:     r_t = pi_old(y_t) / pi_e(y_t)
- sequence:  r = prod_t r_t over the sample's trained tokens (the exact sequence ratio; high variance)
- geometric: r = exp(mean_t log r_t) over them (the per-token geometric mean; length-independent)

Two ways to bound it:
- truncate (TIS): w = min(r, cap). No token is dropped; large ratios are capped (biased, low variance).
- mask (MIS / IcePop): w = r where low <= r <= high, else 0. Tokens (token level: IcePop) or whole
  sequences (sequence / geometric level: MIS) outside the band are dropped from the gradient.

The weight multiplies the clipped PPO surrogate of each token (not the KL or entropy terms), as in slime's
and verl's TIS; a method's own importance weights (DUET's unbiasing weights, per sample) multiply as well:
the two correct independent shifts (which prompts were sampled how often; which engine sampled the tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

MismatchMode = Literal["none", "truncate", "mask"]
MismatchLevel = Literal["token", "sequence", "geometric"]
MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: large enough for any cap or band, small enough never to overflow


@dataclass(frozen=True)
class MismatchSpec:
    """`grpo.mismatch` as the trainer sees it."""

    mode: str = "none"
    level: str = "token"
    cap: float = 2.0  # truncate: upper bound C of the weight
    low: float = 0.5  # mask: the band [low, high] of ratios kept
    high: float = 2.0


@dataclass
class MismatchWeights:
    """Per-token weights and which tokens the correction changed (all `[B, T]`)."""

    weights: torch.Tensor
    truncated: torch.Tensor  # 1 where the weight was capped (truncate)
    masked: torch.Tensor  # 1 where the token was dropped (mask)


def log_ratios(old_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor,
               level: str) -> torch.Tensor:
    """log r per token at `level` (rows are samples; only tokens with mask > 0 enter sequence sums)."""
    per_token = (old_logprobs - engine_logprobs).float()
    if level == "token":
        return per_token
    trained = (mask > 0).float()
    summed = (per_token * trained).sum(dim=-1, keepdim=True)
    if level == "sequence":
        return summed.expand_as(per_token)
    if level == "geometric":
        return (summed / trained.sum(dim=-1, keepdim=True).clamp(min=1.0)).expand_as(per_token)
    raise ValueError(f"unknown mismatch level {level!r}; expected token, sequence or geometric")


def importance_weights(old_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor,
                       spec: MismatchSpec) -> MismatchWeights:
    """The correction's per-token weights (no gradient flows through them)."""
    with torch.no_grad():
        zeros = torch.zeros_like(mask, dtype=torch.float32)
        if spec.mode == "none":
            return MismatchWeights(torch.ones_like(zeros), zeros, zeros.clone())
        ratio = log_ratios(old_logprobs, engine_logprobs, mask, spec.level).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()
        trained = (mask > 0).float()
        if spec.mode == "truncate":
            capped = (ratio > spec.cap).float()
            return MismatchWeights(torch.clamp(ratio, max=spec.cap), capped * trained, zeros)
        if spec.mode == "mask":
            outside = ((ratio < spec.low) | (ratio > spec.high)).float()
            return MismatchWeights(ratio * (1.0 - outside), zeros, outside * trained)
        raise ValueError(f"unknown mismatch mode {spec.mode!r}; expected none, truncate or mask")


def mismatch_sums(train_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Token sums (to be divided by the token count) and maxima of how far trainer and engine disagree:
    |logp_train - logp_engine| and the k3 estimate of KL(engine || trainer) from the engine's samples."""
    trained = mask > 0
    if not bool(trained.any()):
        return {"abs_diff": 0.0, "abs_diff_max": 0.0, "kl": 0.0, "tokens": 0.0}
    diff = (train_logprobs - engine_logprobs).float()[trained]
    kl = torch.exp(diff) - 1.0 - diff  # log(pi_train/pi_e) = diff; k3 of KL(pi_e || pi_train)
    return {"abs_diff": float(diff.abs().sum()), "abs_diff_max": float(diff.abs().max()), "kl": float(kl.sum()),
            "tokens": float(trained.sum())}


def mismatch_means(sums: dict[str, float]) -> dict[str, float]:
    """`mismatch_sums` (possibly summed over micro-batches and ranks) as per-token means and the maximum."""
    n = max(sums["tokens"], 1.0)
    return {"abs_diff_mean": sums["abs_diff"] / n, "abs_diff_max": sums["abs_diff_max"], "kl": sums["kl"] / n}
