"""Training methods behind the plan / finish / update hooks; `build_method` picks one by config."""

from slime_ext.config.schema import Config
from slime_ext.methods.base import Method, PromptPlan
from slime_ext.methods.grpo import GRPO

IMPLEMENTED = {"grpo": GRPO}


def build_method(config: Config) -> Method:
    if config.method not in IMPLEMENTED:
        raise NotImplementedError(
            f"method {config.method!r} is configured but not implemented yet (implemented: {sorted(IMPLEMENTED)})"
        )
    return IMPLEMENTED[config.method](config)


__all__ = ["Method", "PromptPlan", "GRPO", "build_method", "IMPLEMENTED"]
