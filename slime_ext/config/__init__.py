"""Run configuration: typed schema, YAML composition, overrides, strict validation."""

from slime_ext.config.loader import ConfigError, ResolvedConfig, load_config, parse_override
from slime_ext.config.schema import Config

__all__ = ["Config", "ConfigError", "ResolvedConfig", "load_config", "parse_override", "main"]


def main(argv: list[str] | None = None) -> int:
    from slime_ext.config.__main__ import main as _main

    return _main(argv)
