"""Method-independent RL math (pure torch): GRPO advantages, policy losses, KL, aggregation, pass@k; and
when torch's grouped matmul runs (`grouped_matmul`, shared by the engine's forward and the trainer's experts)."""

from slime_ext.algo.advantages import group_advantages, grouped_advantages
from slime_ext.algo.losses import (
    LossSpec,
    aggregate,
    entropy_from_logits,
    grpo_per_token_loss,
    kl_penalty,
    loss_coefficients,
    ppo_clip_loss,
)
from slime_ext.algo.passk import mean_at_k, pass_at_k, pass_at_k_over_prompts

__all__ = [
    "LossSpec",
    "group_advantages",
    "grouped_advantages",
    "aggregate",
    "entropy_from_logits",
    "grpo_per_token_loss",
    "loss_coefficients",
    "kl_penalty",
    "ppo_clip_loss",
    "mean_at_k",
    "pass_at_k",
    "pass_at_k_over_prompts",
]
