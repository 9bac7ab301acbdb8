"""The `tandem` config section, and `tandem_axes` (the after-training evaluation axes, which any GRPO-family
method's entry declares: the Tandem study evaluates its GRPO baseline on them too)."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field

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
