"""The full run config: the run-wide sections plus every registered method's own section.

`Config` is composed from `slime_ext.methods.registry` when this module is imported; `config_model()`
recomposes it after `register_method` (a method added at run time). `method` must name a registered method,
and the sections that method reads run their cross-section checks (`Section.check_run`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, create_model, model_validator

from slime_ext.config.sections import (  # noqa: F401  (re-exported: the sections are part of the schema)
    ClusterConfig, CoreConfig, DataConfig, EvalConfig, GRPOConfig, LoggingConfig, ModelConfig, ParallelConfig, RewardConfig,
    RolloutConfig, RunConfig, Section, SFTConfig, SGLangConfig, SyntheticDataConfig, TokenizerConfig, TrainConfig,
)
from slime_ext.methods import registry


class _MethodChecked(CoreConfig):
    @model_validator(mode="after")
    def _check_method_sections(self) -> "_MethodChecked":
        for key in registry.method_sections(self):
            getattr(self, key).check_run(self)
        return self


_composed: dict[tuple, type] = {}


def config_model() -> type[CoreConfig]:
    """The `Config` model for the registry as it is now (cached per registry content)."""
    key = tuple((name, entry.method, tuple(sorted(entry.sections.items()))) for name, entry in registry.METHODS.items())
    if key not in _composed:
        fields: dict[str, Any] = {"method": (Literal[tuple(registry.METHODS)], "grpo")}
        for section, model in registry.all_sections().items():
            fields[section] = (model, Field(default_factory=model))
        model = create_model("Config", __base__=_MethodChecked, __module__=__name__, **fields)
        model.__doc__ = "The whole resolved run configuration."
        _composed[key] = model
    return _composed[key]


Config = config_model()
