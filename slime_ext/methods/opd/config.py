"""The `opd` config section (on-policy distillation)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from slime_ext.config.sections import ConfigCheckError, Section


class OPDConfig(Section):
    # The teacher: an HF checkpoint (a folder with config.json, or a run directory, whose `hf/` is taken). Its
    # vocabulary must be the student's exactly: it scores the student's token ids as they are.
    teacher: str = ""  # required (checked with the run): empty is an error naming the key
    # Per-token advantage: kl_coef x (log p_teacher - log p_student) on every trained response token.
    kl_coef: float = Field(1.0, gt=0)
    # Weight of the task reward's GRPO advantage added to it (0: pure distillation).
    reward_weight: float = Field(0.0, ge=0)

    def check_run(self, config: Any) -> None:
        """A teacher is named; it is served beside the student in the embedded engine (engine servers do not host
        it yet)."""
        if not self.teacher.strip():
            raise ConfigCheckError("opd.teacher is empty: name the teacher's HF checkpoint or a run directory (its "
                                   "hf/ is taken), e.g. opd.teacher=runs/<grpo run>", ("opd.teacher",))
        if config.rollout.engine != "embedded":
            raise ConfigCheckError(
                f"method opd with rollout.engine = {config.rollout.engine!r}: the teacher is scored by the embedded "
                "engine (it holds the teacher beside the student); a teacher on engine servers of its own is not "
                "built yet: set rollout.engine=embedded", ("rollout.engine", "opd.teacher"))
