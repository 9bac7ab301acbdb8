"""A run's config: the run-wide sections plus the sections of its own method's registry entry, and no other.

`config_model(method)` composes that model from `slime_ext.methods.registry` (a method added at run time with
`register_method` included): `CoreConfig`'s sections plus the entry's `sections` (DUET on Tandem declares `duet`,
`tandem` and `tandem_axes`: composition names what it composes). A key of another method's section is not in
the model, so it is an error (the loader names the section and the methods it belongs to). `method` must be
a registered method whose sections are the model's, and the sections that method reads run their cross-section
checks (`Section.check_run`).

One model per section set, cached. Each is a class of this module named `Config__<key>__<key>...` (sorted
keys; `Config__` for none) and reachable as that attribute, also in a process that never composed it (a
module `__getattr__` composes it on first access), so configs pickle by reference (Ray ships them to actors
with cloudpickle). `Config` is the model of the default method, grpo.
"""

from __future__ import annotations

import sys
from typing import Any

from pydantic import Field, create_model, field_validator, model_validator

from slime_ext.config.sections import ConfigCheckError
from slime_ext.config.sections import (  # noqa: F401  (re-exported: the sections are part of the schema)
    ClusterConfig, CoreConfig, DataConfig, EvalConfig, GRPOConfig, LoggingConfig, ModelConfig, ParallelConfig, RewardConfig,
    RolloutConfig, RunConfig, Section, SFTConfig, SGLangConfig, SyntheticDataConfig, TokenizerConfig, TrainConfig,
)
from slime_ext.methods import registry

DEFAULT_METHOD = "grpo"
MODEL_PREFIX = "Config__"


class _MethodChecked(CoreConfig):
    """Base of every composed model: `method` must read exactly this model's sections."""

    @field_validator("method")
    @classmethod
    def _method_reads_these_sections(cls, method: str) -> str:
        if method not in registry.METHODS:
            raise ValueError(f"method {method!r} is not registered (registered: {', '.join(registry.METHODS)})")
        own = set(cls.model_fields) - set(CoreConfig.model_fields)
        wanted = set(registry.METHODS[method].sections)
        if wanted != own:
            raise ValueError(f"method {method!r} reads the sections {sorted(wanted)}, but this config model holds "
                             f"{sorted(own)} (build it with slime_ext.config.schema.config_model({method!r}))")
        return method

    @model_validator(mode="after")
    def _check_lent_tools(self) -> "_MethodChecked":
        """A tool that a method lends (its registry entry's `tools`) is built by that method: another method's
        run cannot offer it."""
        offered = self.rollout.offered_tools()
        if not offered:
            return self
        from slime_ext.envs import registry as envs

        own = registry.method_tools(self.method)
        foreign = [t for t in offered if t in envs.lent_tools() and t not in own]
        if foreign:
            lenders = sorted(m for m, e in registry.METHODS.items() if set(foreign) & set(e.tools))
            raise ConfigCheckError(
                f"rollout.env_settings.tools offers {foreign}, which only methods {lenders} lend (their method objects "
                f"build it); method {self.method!r} lends {sorted(own) or 'no tools'}: remove it or change method",
                ("rollout.env_settings.tools", "method"))
        return self

    @model_validator(mode="after")
    def _check_partial_rollouts_samplers(self) -> "_MethodChecked":
        """Partial rollouts continue a request after a weight sync as a new request: an engine-side per-request
        sampler (Tandem's turn-taking, DUET's gate, SxS's blocks, DA-GRPO's trigger) would restart its state."""
        samplers = registry.METHODS[self.method].samplers
        if self.rollout.partial_rollouts and samplers:
            raise ConfigCheckError(
                f"rollout.partial_rollouts = true with method {self.method!r}: its requests carry the per-request "
                f"sampler(s) of {list(samplers)}, whose state a request continued after a weight sync would lose; "
                "set rollout.partial_rollouts=false (the sync then waits for the rollout in flight)",
                ("rollout.partial_rollouts", "method"))
        return self

    @model_validator(mode="after")
    def _check_lora_sync(self) -> "_MethodChecked":
        """train.lora.sync = adapter: the rules of `LoRAConfig.check_run`, and no partner model in the engines
        (the adapter is the policy's; a two-model engine would serve the partner without it)."""
        self.train.lora.check_run(self)
        if self.train.lora.sync == "adapter" and registry.method_class(self).holds_partner(self):
            raise ConfigCheckError(f"train.lora.sync = adapter with method {self.method!r}, whose engines hold a partner "
                                   "model beside the policy: set train.lora.sync=merged", ("train.lora.sync", "method"))
        return self

    @model_validator(mode="after")
    def _check_method_sections(self) -> "_MethodChecked":
        for key in registry.method_sections(self):
            getattr(self, key).check_run(self)
        return self


_composed: dict[tuple[tuple[str, str], ...], type] = {}


def model_name(keys: Any) -> str:
    """The class name (and module attribute) of the model holding these method sections."""
    return MODEL_PREFIX + "__".join(sorted(keys))


def _compose(paths: dict[str, str]) -> type[CoreConfig]:
    """The model of the run-wide sections plus these (key -> "module:Model"), cached per section set."""
    cache_key = tuple(sorted(paths.items()))
    if cache_key in _composed:
        return _composed[cache_key]
    keys = sorted(paths)
    for key in keys:
        if key in CoreConfig.model_fields or not key.isidentifier() or "__" in key:
            raise ValueError(f"config section {key!r}: a method section must be a new identifier without '__'")
    owners = [name for name, entry in registry.METHODS.items() if sorted(entry.sections) == keys]
    default = DEFAULT_METHOD if DEFAULT_METHOD in owners else (owners[0] if owners else DEFAULT_METHOD)
    fields: dict[str, Any] = {"method": (str, default)}
    for key in keys:
        section = registry.load_object(paths[key])
        fields[key] = (section, Field(default_factory=section))
    name = model_name(keys)
    module = sys.modules[__name__]
    taken = module.__dict__.get(name)
    if taken is not None:  # the same keys with other models (a method re-registered at run time): a new name
        n = 2
        while f"{name}_{n}" in module.__dict__:
            n += 1
        name = f"{name}_{n}"
    model = create_model(name, __base__=_MethodChecked, __module__=__name__, **fields)
    model.__doc__ = f"A run's resolved configuration: the run-wide sections plus {keys or 'no method section'}."
    setattr(module, name, model)
    _composed[cache_key] = model
    return model


def config_model(method: str = DEFAULT_METHOD) -> type[CoreConfig]:
    """The config model of a run of `method`: the run-wide sections plus that registry entry's sections."""
    if method not in registry.METHODS:
        raise ValueError(f"method {method!r} is not registered (registered: {', '.join(registry.METHODS)})")
    registry.all_sections_paths()  # one model per section key across the registry
    return _compose(dict(registry.METHODS[method].sections))


def section_owners() -> dict[str, list[str]]:
    """Every registered method section -> the methods whose entries declare it (registry order)."""
    owners: dict[str, list[str]] = {}
    for name, entry in registry.METHODS.items():
        for key in entry.sections:
            owners.setdefault(key, []).append(name)
    return owners


def __getattr__(name: str) -> Any:
    """`Config__<keys>` composed on first access (unpickling a config in a process that has not built it)."""
    if name.startswith(MODEL_PREFIX):
        rest = name[len(MODEL_PREFIX):]
        keys = rest.split("__") if rest else []
        sections = registry.all_sections_paths()
        if all(key in sections for key in keys) and model_name(keys) == name:
            return _compose({key: sections[key] for key in keys})
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


Config = config_model(DEFAULT_METHOD)
