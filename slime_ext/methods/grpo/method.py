"""Plain GRPO: n samples per prompt, verifier reward, group-relative advantages."""

from __future__ import annotations

from statistics import mean
from typing import Any, Optional

from sglang_patches.decoding import SamplingParams
from slime_ext.algo import grouped_advantages
from slime_ext.data import Sample, SampleStatus
from slime_ext.methods.base import Method, PromptPlan
from slime_ext.rewards import ReasonCounter, get_verifier


class GRPO(Method):
    name = "grpo"

    def __init__(self, config: Any, tokenizer: Optional[Any] = None):
        super().__init__(config, tokenizer)
        self.verify = get_verifier(config.reward.type)
        r = config.rollout
        self.sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                                       max_new_tokens=r.max_response_len, stop=list(r.stop))

    def plan(self, prompts: list[dict], step: int) -> list[PromptPlan]:
        return [PromptPlan(self.config.rollout.n_samples_per_prompt, self.sampling) for _ in prompts]

    def score(self, groups: list[list[Sample]]) -> ReasonCounter:
        """Verifier reward on every sample's decoded response (failed rollouts score 0)."""
        reasons = ReasonCounter()
        for group in groups:
            for s in group:
                if s.status == SampleStatus.FAILED:
                    s.reward = 0.0
                    continue
                result = self.verify(s.response_text or "", s.label)
                s.reward = float(result.score)
                s.rewards["correct"] = float(result.score)
                reasons.add(result)
        return reasons

    def finish(self, groups: list[list[Sample]], step: int) -> dict[str, float]:
        reasons = self.score(groups)
        samples = [s for g in groups for s in g]
        g = self.config.grpo
        adv = grouped_advantages([s.reward for s in samples], [s.group_id for s in samples],
                                 normalize_std=g.normalize_std, eps=g.adv_eps)
        for s, a in zip(samples, adv.tolist()):
            s.advantage = a
            if s.status == SampleStatus.FAILED:  # never train on a failed rollout
                s.loss_mask = [0.0] * s.response_len
                s.advantage = 0.0
        rewards = [s.reward for s in samples]
        group_means = [mean(x.reward for x in grp) for grp in groups]
        metrics = {
            "reward/mean": mean(rewards),
            "reward/all_correct_groups": sum(m == 1.0 for m in group_means) / len(groups),
            "reward/all_wrong_groups": sum(m == 0.0 for m in group_means) / len(groups),
            "response_len/mean": mean(s.response_len for s in samples),
            "rollout/truncated": sum(s.status == SampleStatus.TRUNCATED for s in samples) / len(samples),
        }
        for reason, count in reasons.as_dict().items():
            metrics[f"verifier/{reason}"] = count / len(samples)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {}
