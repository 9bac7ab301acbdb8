"""The `duet` config section."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from slime_ext.config.sections import ConfigCheckError, Section


class DuetConfig(Section):
    """DUET's settings (docs/methods/duet.md)."""

    budget_fraction: Optional[float] = Field(1.0, gt=0, le=1)
    budget_tokens: Optional[int] = Field(None, ge=1)
    allocator: Literal["bisection", "knapsack"] = "bisection"
    eps_abort: float = Field(0.05, gt=0, le=1)
    grace: int = Field(150, ge=0)
    poll: int = Field(8, ge=1)
    marker_window: int = Field(256, ge=1)
    length_window: int = Field(1024, ge=1)
    refit_every: int = Field(10, ge=1)
    k1_quantile: float = Field(0.30, gt=0, lt=1)
    k2_quantile: float = Field(0.80, gt=0, lt=1)
    eps_pre: float = Field(0.05, gt=0, le=1)
    n_min: int = Field(1, ge=1)
    n_max: int = Field(32, ge=1)
    bisection_iters: int = Field(10, ge=1)
    s_floor_cold: float = Field(0.01, gt=0)
    trim_entropy: float = Field(0.3, ge=0)  # after the marker, EOS at the first step below this entropy (nats)

    @model_validator(mode="after")
    def _check(self) -> "DuetConfig":
        if self.n_min > self.n_max:
            raise ConfigCheckError(f"n_min ({self.n_min}) must be <= n_max ({self.n_max})", ("n_min", "n_max"))
        if self.k1_quantile >= self.k2_quantile:
            raise ConfigCheckError(f"k1_quantile ({self.k1_quantile}) must be smaller than k2_quantile "
                                   f"({self.k2_quantile})", ("k1_quantile", "k2_quantile"))
        return self
