"""SxS RL (docs/methods/sxs.md): think/speak rollouts, reward on the visible answer, GRPO with KL to the
post-SFT reference (`grpo.kl_coef`), uniform groups dropped, optional exact QP shaping.

The channel of every token comes from `sglang_patches.sxs.SxSChannelSampler` (which can also enforce
the tag structure); the verifier sees only the speak-channel text. The latency metrics of
`slime_ext.methods.sxs.metrics` are logged every step and reported in evaluation.
"""

from __future__ import annotations

from statistics import mean
from typing import Any, Optional

from sglang_patches.sxs import SPEAK, THINK, tag_ids, visible_token_ids
from slime_ext.config.schema import Config
from slime_ext.data import Sample, SampleStatus
from slime_ext.data.generation import GenerateResult
from slime_ext.methods.base import PromptPlan
from slime_ext.methods.grpo.method import GRPO
from slime_ext.rewards import ReasonCounter
from slime_ext.methods.sxs.metrics import content_length, latency_metrics, runs
from slime_ext.methods.sxs.shaping import check_separation, shaping_targets, solve_shaping_qp

LATENCY_KEYS = ("ari", "abo", "airw", "think_blocks", "total_len", "reasoning_len", "response_len", "first_disclosure")


def longest_think(channels: list[int]) -> int:
    return max((n for ch, _, n in runs(channels) if ch == THINK), default=0)


class SxS(GRPO):
    name = "sxs_rl"

    def __init__(self, config: Config, tokenizer: Optional[Any] = None):
        super().__init__(config, tokenizer)
        if tokenizer is None:
            raise ValueError("SxS needs the tokenizer (tag ids and the visible-answer projection)")
        self.tokenizer = tokenizer
        self.tags = tag_ids(tokenizer)
        self.spec = {"kind": "sxs_channel", **self.tags, "enforce": config.sxs.enforce_tags}

    # -- shared with evaluation ----------------------------------------------------------------------
    def channels_of(self, annotations: list[dict]) -> list[int]:
        return [int(a.get("channel", THINK)) for a in annotations]

    def visible_text(self, output_ids: list[int], channels: list[int]) -> str:
        return self.tokenizer.decode(visible_token_ids(output_ids, channels, self.tags), skip_special_tokens=True)

    def project(self, result: GenerateResult) -> str:
        return self.visible_text(result.output_ids, self.channels_of(result.annotations))

    def response_metrics(self, result: GenerateResult) -> dict[str, float]:
        """Latency metrics over the content tokens (a final EOS dropped); tags carry no disclosed text."""
        n = content_length(result.output_ids, self.tokenizer.eos_token_id)
        tags = set(self.tags.values())
        texts = ["" if t in tags else self.tokenizer.decode([t]) for t in result.output_ids[:n]]
        return latency_metrics(self.channels_of(result.annotations)[:n], texts)

    def eval_options(self) -> dict[str, Any]:
        """Evaluation scores the visible answer and reports the latency metrics."""
        return {"sampler_specs": [self.spec], "project": self.project, "response_metrics": self.response_metrics}

    # -- hooks ---------------------------------------------------------------------------------------
    def plan(self, prompts: list[dict], step: int) -> list[PromptPlan]:
        n = self.config.rollout.n_samples_per_prompt
        return [PromptPlan(n, self.sampling, [dict(self.spec)]) for _ in prompts]

    def score(self, groups: list[list[Sample]]) -> ReasonCounter:
        reasons = ReasonCounter()
        c = self.config.sxs
        self._shaped = 0
        for group in groups:
            for s in group:
                notes = s.metadata.get("annotations") or []
                if len(notes) != s.response_len:
                    raise ValueError(f"SxS rollout {s.sample_id!r} has {len(notes)} channel annotations for "
                                     f"{s.response_len} tokens; is the sxs_channel sampler running?")
                s.channel = self.channels_of(notes)
                if s.status == SampleStatus.FAILED:
                    s.reward = 0.0
                    continue
                result = self.verify(self.visible_text(s.response_ids, s.channel), s.label)
                s.reward = float(result.score)
                s.rewards["correct"] = float(result.score)
                reasons.add(result)
            correct = [s.rewards.get("correct", 0.0) > 0 for s in group]
            if c.qp_shaping and any(correct) and not all(correct):
                targets = shaping_targets([longest_think(s.channel or []) for s in group], correct, self.config.sxs.s_min)
                shaped = solve_shaping_qp(targets, correct, c.qp_eps)
                check_separation(shaped, correct, c.qp_eps)  # verified on every group it is applied to
                for s, r in zip(group, shaped):
                    s.reward = float(r)
                self._shaped += 1
        return reasons

    def finish(self, groups: list[list[Sample]], step: int) -> dict[str, float]:
        metrics = super().finish(groups, step)
        dropped = 0
        if self.config.sxs.drop_uniform_groups:
            for group in groups:
                if len({s.rewards.get("correct", 0.0) for s in group}) == 1:  # all correct or all wrong
                    dropped += 1
                    for s in group:
                        s.weight, s.advantage = 0.0, 0.0
                        s.loss_mask = [0.0] * s.response_len
        samples = [s for g in groups for s in g]
        eos = self.tokenizer.eos_token_id
        lat = [latency_metrics((s.channel or [])[: content_length(s.response_ids, eos)]) for s in samples]
        for key in LATENCY_KEYS:
            values = [m[key] for m in lat if m[key] == m[key]]
            metrics[f"sxs/{key}"] = mean(values) if values else float("nan")
        metrics["reward/correct"] = mean(s.rewards.get("correct", 0.0) for s in samples)
        metrics["sxs/dropped_groups"] = dropped / len(groups)
        metrics["sxs/shaped_groups"] = getattr(self, "_shaped", 0) / len(groups)
        metrics["sxs/speak_share"] = mean(
            (sum(c == SPEAK for c in s.channel) / max(len(s.channel), 1)) for s in samples if s.channel is not None)
        return metrics
