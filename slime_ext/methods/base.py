"""The method hooks every training method implements (DESIGN.md, "Data flow of one step").

    plan(prompts, step)  -> how to roll out each prompt (samples, sampler specs, sampling params)
    finish(groups)       -> score, advantages, masks, weights on the finished rollouts (in place)
    update(stats)        -> controller updates after the optimizer step (DUET windows, DA-GRPO lambda)

None of them knows which engine or trainer host runs the step. Controller state is saved with
checkpoints (`state_dict`), so a resumed run continues exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from sglang_patches.sampling import SamplingParams
from slime_ext.data import Sample


@dataclass
class PromptPlan:
    """How to roll out one prompt: `n` samples with these sampler specs and sampling parameters."""

    n: int
    sampling: SamplingParams
    sampler_specs: list[dict[str, Any]] = field(default_factory=list)


class Method:
    name = "base"
    train_kind = "grpo"  # which trainer loss the method's batches use
    data_epoch = 0  # the data source's epoch, set by the rollout manager before each step

    def data_phase(self) -> Optional[str]:
        """Name of the data phase to draw from (continual methods); None = the run's training data."""
        return None

    def phase_train_rows(self, name: str) -> list[dict]:
        raise NotImplementedError(f"method {self.name!r} has no data phases")

    def prompts_to_draw(self, prompts_per_step: int) -> int:
        """How many prompts to roll out this step (DAPO oversamples)."""
        return prompts_per_step

    def plan(self, prompts: list[dict], step: int) -> list[PromptPlan]:
        raise NotImplementedError

    def finish(self, groups: list[list[Sample]], step: int) -> dict[str, float]:
        raise NotImplementedError

    def update(self, stats: dict[str, float], step: int) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
