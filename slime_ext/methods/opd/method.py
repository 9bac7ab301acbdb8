"""On-policy distillation (`method: opd`): the student samples, the teacher returns its logprob of every sampled
token (temperature 1, the student's exact ids, prefill only), and each trained token's advantage is
`opd.kl_coef * (log p_teacher - log p_student)`, plus `opd.reward_weight` times the GRPO advantage of the task
reward. The student's logprob is the engine's (the behaviour logprob, corrected like any other by
`grpo.mismatch`). Tokens with loss mask 0 (the observations of tool episodes) get no term: they are context
for both models and never scored."""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import Any, Optional

from slime_ext.data import Sample
from slime_ext.methods.base import ScoringServers
from slime_ext.methods.grpo.method import GRPO
from slime_ext.tokenizer import checkpoint_with_vocabulary

SCORED_KEY = "scored_logprobs"  # Sample.metadata key the rollout manager fills with the scoring model's logprobs


def teacher_dir(path: str) -> str:
    """An HF checkpoint folder, or a run directory (its final `hf/`)."""
    p = Path(path)
    return str(p / "hf") if not (p / "config.json").exists() and (p / "hf" / "config.json").exists() else path


def distillation_advantages(teacher: list[float], student: list[float], loss_mask: list[float],
                            kl_coef: float) -> list[float]:
    """kl_coef x (teacher - student) logprob per token; 0 where the token is not trained."""
    return [kl_coef * (t - s) if m > 0 else 0.0 for t, s, m in zip(teacher, student, loss_mask)]


class OPD(GRPO):
    name = "opd"
    needs_partner = True  # the embedded engine holds the teacher beside the student

    @classmethod
    def holds_partner(cls, config: Any) -> bool:
        return config.rollout.engine == "embedded"  # engine servers: the teacher has servers of its own

    @classmethod
    def scoring_servers(cls, config: Any) -> Optional[ScoringServers]:
        """On the engine-server path the teacher is served by `opd.teacher_engines` servers of its own."""
        if config.rollout.engine != "sglang":
            return None
        o = config.opd
        return ScoringServers(teacher_dir(o.teacher), o.teacher_engines, o.teacher_tp_size, o.teacher_placement,
                              o.teacher_mem_fraction_static, o.teacher_model_config, key="opd.teacher",
                              size_keys="opd.teacher_engines x opd.teacher_tp_size", placement_key="opd.teacher_placement",
                              mem_key="opd.teacher_mem_fraction_static")

    def partner_dir(self, start_dir: Path) -> Optional[Path]:
        return checkpoint_with_vocabulary(teacher_dir(self.config.opd.teacher), self.tokenizer, "opd.teacher")

    def scoring_model(self) -> Optional[str]:
        """The engine model whose logprobs of the sampled tokens the manager attaches (`SCORED_KEY`); with scoring
        servers (the engine-server path) the manager sends the same request to those instead."""
        return "partner"

    def finish(self, groups: list[list[Sample]], step: int) -> dict[str, float]:
        metrics = super().finish(groups, step)  # rewards and the GRPO advantage of the task reward
        o = self.config.opd
        gaps: list[float] = []
        for s in (s for g in groups for s in g):
            teacher = s.metadata.pop(SCORED_KEY, None)
            if teacher is None or s.logprobs is None or len(teacher) != s.response_len:
                raise ValueError(f"opd: sample {s.sample_id!r} has no teacher logprob per response token (got "
                                 f"{None if teacher is None else len(teacher)} for {s.response_len}) or no engine "
                                 "logprobs; the rollout manager scores every sample with the teacher")
            s.advantage = (s.advantage or 0.0) * o.reward_weight
            s.token_advantages = distillation_advantages(teacher, s.logprobs, s.loss_mask, o.kl_coef)
            gaps += [b - t for t, b, m in zip(teacher, s.logprobs, s.loss_mask) if m > 0]
        metrics.update({"opd/reverse_kl": mean(gaps) if gaps else 0.0,
                        "opd/scored_tokens": float(len(gaps))})
        return metrics
