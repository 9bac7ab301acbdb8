"""Run configuration: typed schema, YAML composition, overrides, strict validation.

The names below load on first access (PEP 562): a method's config module imports `slime_ext.config.sections`, and an
eager import of the schema here would compose the registry's sections while that module is still half-initialised.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Config", "ConfigError", "ResolvedConfig", "load_config", "parse_override", "main"]

_LAZY = {"Config": "slime_ext.config.schema", "ConfigError": "slime_ext.config.loader",
         "ResolvedConfig": "slime_ext.config.loader", "load_config": "slime_ext.config.loader",
         "parse_override": "slime_ext.config.loader"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> int:
    from slime_ext.config.__main__ import main as _main

    return _main(argv)
