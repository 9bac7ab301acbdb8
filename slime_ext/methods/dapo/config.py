"""The `dapo` config section."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from slime_ext.config.sections import ConfigCheckError, Section


class DapoConfig(Section):
    eps_clip_low: float = Field(0.20, ge=0, le=1)
    eps_clip_high: float = Field(0.28, ge=0, le=10)
    oversample: float = Field(1.5, ge=1)
    overlong_buffer: int = Field(512, ge=0)
    overlong_penalty: float = Field(1.0, ge=0)

    def check_run(self, config: Any) -> None:
        """The overlong buffer must leave a penalty-free zone."""
        if self.overlong_buffer >= config.rollout.max_response_len:
            raise ConfigCheckError(f"dapo.overlong_buffer ({self.overlong_buffer}) must be smaller than "
                                   f"rollout.max_response_len ({config.rollout.max_response_len}): the soft "
                                   "penalty would reach into every response",
                                   ("dapo.overlong_buffer", "rollout.max_response_len"))
