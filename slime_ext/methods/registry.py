"""The method registry: one line per method, name -> (method class, the config sections it reads).

Entries are import paths, so reading the registry (the config loader does, to compose the full config
schema) imports no method code. A method package holds `method.py` (its hooks) and, if it has settings of
its own, `config.py` (its section). Composition stays composition: DUET on Tandem reads both sections.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from slime_ext.methods.base import Method


@dataclass(frozen=True)
class MethodEntry:
    method: str  # "package.module:Class"
    sections: dict[str, str] = field(default_factory=dict)  # config key -> "package.module:SectionModel"


_TANDEM = {"tandem": "slime_ext.methods.tandem.config:TandemConfig"}
_DUET = {"duet": "slime_ext.methods.duet.config:DuetConfig"}
_DAGRPO = {"dagrpo": "slime_ext.methods.dagrpo.config:DAGRPOConfig"}
_SXS = {"sxs": "slime_ext.methods.sxs.config:SxSConfig"}

METHODS: dict[str, MethodEntry] = {
    "grpo": MethodEntry("slime_ext.methods.grpo.method:GRPO"),
    "dapo": MethodEntry("slime_ext.methods.dapo.method:DAPO", {"dapo": "slime_ext.methods.dapo.config:DapoConfig"}),
    "tandem": MethodEntry("slime_ext.methods.tandem.method:Tandem", _TANDEM),
    "tandem_klreg": MethodEntry("slime_ext.methods.tandem.method:TandemKLReg", _TANDEM),
    "duet": MethodEntry("slime_ext.methods.duet.method:Duet", _DUET),
    "duet_tandem": MethodEntry("slime_ext.methods.duet_tandem.method:DuetTandem", _DUET | _TANDEM),
    "sxs_sft": MethodEntry("slime_ext.methods.sxs.method:SxS", _SXS),
    "sxs_rl": MethodEntry("slime_ext.methods.sxs.method:SxS", _SXS),
    "dagrpo": MethodEntry("slime_ext.methods.dagrpo.method:DAGRPO", _DAGRPO),
    "collab_grpo": MethodEntry("slime_ext.methods.dagrpo.method:CollabGRPO", _DAGRPO),
}


def load_object(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def register_method(name: str, entry: MethodEntry) -> None:
    """Add a method at run time (tests, plugins); `slime_ext.config.schema.config_model()` then accepts it."""
    METHODS[name] = entry


def all_sections() -> dict[str, type]:
    """Every registered config section: key -> pydantic model (a key shared by methods must name one model)."""
    paths: dict[str, str] = {}
    for name, entry in METHODS.items():
        for key, path in entry.sections.items():
            if paths.setdefault(key, path) != path:
                raise ValueError(f"config section {key!r}: method {name!r} registers {path}, another {paths[key]}")
    return {key: load_object(path) for key, path in paths.items()}


def method_name(config: Any) -> str:
    return config.method


def _entry(config: Any) -> MethodEntry:
    if config.method not in METHODS:
        raise ValueError(f"method {config.method!r} is not registered (registered: {sorted(METHODS)})")
    return METHODS[config.method]


def method_sections(config: Any) -> list[str]:
    """The config sections the configured method reads."""
    return list(_entry(config).sections)


def method_class(config: Any) -> type["Method"]:
    """The configured method's class (class-level facts such as the engine's models need no instance)."""
    return load_object(_entry(config).method)


def data_transform(config: Any) -> Any:
    """The synthetic-row transform a registered section asks for under this config (at most one), or None."""
    found = [(key, fn) for key in all_sections() if (fn := getattr(config, key).data_transform(config)) is not None]
    if len(found) > 1:
        raise ValueError(f"config sections {[k for k, _ in found]} each rewrite the data rows; enable one")
    return found[0][1] if found else None


def build_method(config: Any, tokenizer: Optional[Any] = None) -> "Method":
    """The configured method; its `name` is the registered name (one class may serve several names)."""
    method = method_class(config)(config, tokenizer)
    method.name = config.method
    return method
