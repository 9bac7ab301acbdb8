"""DAPO (DUET's baseline): asymmetric clip, dynamic sampling with oversampling, overlong soft penalty.

- Clip: the loss spec carries `dapo.eps_clip_low` / `eps_clip_high` (0.20 / 0.28) to the trainer.
- Dynamic sampling: `ceil(oversample x prompts_per_step)` prompts are rolled out; groups whose rewards
  are all equal carry no GRPO signal and are dropped, and of the rest the first `prompts_per_step` are
  trained. Dropped groups keep their rollouts in the logs but get an all-zero mask and weight 0, so they
  count neither in the gradient nor in the token-mean denominator.
- Overlong soft penalty: a response longer than `L_max - buffer` loses
  `penalty x (len - (L_max - buffer)) / buffer` (at most `penalty`) before the advantages.
"""

from __future__ import annotations

import dataclasses
import math
from statistics import mean

from slime_ext.algo import LossSpec
from slime_ext.data import Sample
from slime_ext.methods.grpo.method import GRPO


def overlong_penalty(length: int, max_len: int, buffer: int, penalty: float) -> float:
    """DAPO's soft overlong punishment (0 inside the safe zone, linear down to -penalty at max_len)."""
    if buffer <= 0:
        return 0.0
    start = max_len - buffer
    if length <= start:
        return 0.0
    return -penalty * min(1.0, (length - start) / buffer)


class DAPO(GRPO):
    name = "dapo"

    def loss_spec(self) -> LossSpec:
        d = self.config.dapo
        return dataclasses.replace(super().loss_spec(), eps_clip_low=d.eps_clip_low, eps_clip_high=d.eps_clip_high)

    def prompts_to_draw(self, prompts_per_step: int) -> int:
        return math.ceil(self.config.dapo.oversample * prompts_per_step)

    def score(self, groups):
        reasons = super().score(groups)
        d, max_len = self.config.dapo, self.config.rollout.max_response_len
        for group in groups:
            for s in group:
                p = overlong_penalty(s.response_len, max_len, d.overlong_buffer, d.overlong_penalty)
                s.rewards["overlong"] = p
                s.reward = (s.reward or 0.0) + p
        return reasons

    def finish(self, groups: list[list[Sample]], step: int) -> dict[str, float]:
        metrics = super().finish(groups, step)
        wanted = self.config.rollout.prompts_per_step
        informative = [g for g in groups if len({s.reward for s in g}) > 1]
        kept = {id(g) for g in informative[:wanted]}
        for g in groups:
            if id(g) not in kept:
                for s in g:
                    s.weight = 0.0
                    s.loss_mask = [0.0] * s.response_len
        metrics.update({
            "dapo/drawn_groups": len(groups), "dapo/informative_groups": len(informative),
            "dapo/trained_groups": len(kept), "dapo/batch_fill": len(kept) / max(wanted, 1),
            "dapo/overlong_rate": mean(s.rewards.get("overlong", 0.0) < 0 for g in groups for s in g),
        })
        return metrics
