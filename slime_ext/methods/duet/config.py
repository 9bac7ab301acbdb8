"""The `duet` config section."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional

from pydantic import Field, model_validator

from slime_ext.config.sections import ConfigCheckError, Section, refuse_deep_staleness


class DuetConfig(Section):
    """DUET's settings (docs/methods/duet.md)."""

    budget_fraction: Optional[float] = Field(1.0, gt=0, le=1)
    budget_tokens: Optional[int] = Field(None, ge=1)
    allocator: Literal["bisection", "knapsack"] = "bisection"
    knapsack_time_limit_s: float = Field(30.0, gt=0)  # past it the knapsack falls back to the LP relaxation
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

    # the keys that act only through the marker-gated abort (the sampler) and its K1/K2 window
    GATE_KEYS: ClassVar[tuple[str, ...]] = ("eps_abort", "grace", "poll", "marker_window", "trim_entropy",
                                            "length_window", "refit_every", "k1_quantile", "k2_quantile")

    def check_run(self, config: Any) -> None:
        """Multi-turn episodes (`rollout.env`) run without the gate (slime_ext/methods/duet/method.py): a key
        that acts only through it would change nothing, and a method whose plans carry another per-request
        sampler (DUET on Tandem: the tandem sampler authors every token) cannot run episodes at all. Asynchronous
        runs: at most one step stale (its budget allocation is a per-step controller)."""
        refuse_deep_staleness(config, config.method, "budget allocation (per-prompt statistics, refit schedule)")
        if config.rollout.env is None:
            return
        from slime_ext.methods.registry import METHODS

        others = [m for m in METHODS[config.method].samplers if m != "sglang_patches.duet"]
        if others:
            raise ConfigCheckError(
                f"method {config.method} with rollout.env = {config.rollout.env!r}: its plans carry the per-request "
                f"sampler(s) of {others}, whose state would restart every turn; multi-turn episodes take DUET "
                "without them (method: duet) or no rollout.env", ("rollout.env",))
        gate = sorted(k for k in self.model_fields_set if k in self.GATE_KEYS)
        if gate:
            keys = tuple(f"duet.{k}" for k in gate)
            raise ConfigCheckError(
                f"duet.{gate[0]} is set but rollout.env = {config.rollout.env!r}: in multi-turn episodes DUET runs "
                f"without its marker-gated abort (a per-request sampler cannot span turns), so {list(keys)} would "
                "change nothing; remove them (configs/duet_tools.yaml)", keys + ("rollout.env",))

    @model_validator(mode="after")
    def _check(self) -> "DuetConfig":
        if self.n_min > self.n_max:
            raise ConfigCheckError(f"n_min ({self.n_min}) must be <= n_max ({self.n_max})", ("n_min", "n_max"))
        if self.k1_quantile >= self.k2_quantile:
            raise ConfigCheckError(f"k1_quantile ({self.k1_quantile}) must be smaller than k2_quantile "
                                   f"({self.k2_quantile})", ("k1_quantile", "k2_quantile"))
        return self
