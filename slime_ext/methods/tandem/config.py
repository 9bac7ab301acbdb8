"""The `tandem` config section, and `tandem_axes` (the after-training evaluation axes, which any GRPO-family
method's entry declares: the Tandem study evaluates its GRPO baseline on them too)."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field, model_validator

from slime_ext.config.sections import ConfigCheckError, Section


class TandemConfig(Section):
    """Tandem RL's settings (docs/methods/tandem.md; values marked ref code come from the authors' public code)."""

    p_senior: float = Field(0.5, ge=0, le=1)
    kappa: int = Field(32, ge=1)
    junior_weight: float = Field(0.0, ge=0, le=1)
    junior_path: Optional[str] = None  # None: frozen copy of the senior's starting checkpoint
    klreg_beta: float = Field(0.05, ge=0)

    def check_run(self, config: Any) -> None:
        """SGLang workers read the handoff boundary set from the checkpoint's tokenizer, so they need it."""
        if config.rollout.engine == "sglang" and not config.model.hf_path:
            raise ConfigCheckError(f"method {config.method} on rollout.engine=sglang needs model.hf_path (the "
                                   "engine workers read the handoff boundary set from its tokenizer)",
                                   ("rollout.engine", "model.hf_path"))


class TandemAxesConfig(Section):
    """After training, evaluate handoff robustness, drift and legibility against the junior on the first
    `prompts` held-out prompts (slime_ext.methods.tandem.eval_axes; docs/methods/tandem.md). Its own section:
    every GRPO-family method offers the evaluation (the Tandem study turns it on for the GRPO baseline too)."""

    enabled: bool = False
    prompts: int = Field(256, ge=1)
    # the model the axes pair the trained one with; null: the method's junior (`tandem.junior_path`, the KL-Reg
    # reference, else the starting checkpoint). A GRPO baseline names the same junior as the tandem arms here.
    junior_path: Optional[str] = None
    # team rollouts per prompt for the handoff pass@k; null: `eval.n_samples`
    n_samples: Optional[int] = Field(None, ge=1)
    # the handoff pass@k values; null: `eval.k` (those up to the samples)
    k: Optional[list[int]] = None

    @model_validator(mode="after")
    def _check_k(self) -> "TandemAxesConfig":
        if self.k is not None and (not self.k or min(self.k) < 1):
            raise ConfigCheckError(f"tandem_axes.k = {self.k}: give pass@k values of at least 1", ("k",))
        return self

    def samples(self, config: Any) -> int:
        return self.n_samples if self.n_samples is not None else config.eval.n_samples

    def ks(self, config: Any) -> list[int]:
        """The pass@k values to report; k above the team rollouts per prompt is an error, not dropped silently."""
        n = self.samples(config)
        if self.k is None:
            return [k for k in config.eval.k if k <= n]
        if max(self.k) > n:
            raise ConfigCheckError(f"tandem_axes.k = {self.k} asks pass@{max(self.k)} from {n} team rollouts per "
                                   "prompt; raise tandem_axes.n_samples", ("tandem_axes.k", "tandem_axes.n_samples"))
        return list(self.k)

    def check_run(self, config: Any) -> None:
        self.ks(config)
