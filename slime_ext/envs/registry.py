"""The environment and tool registries: name -> import path, like `slime_ext.methods.registry`.

Reading a registry imports no environment code, so the config layer validates `rollout.env` and
`rollout.env_settings` from here (the settings model is imported only for the configured environment).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class EnvEntry:
    env: str  # "package.module:Class", a subclass of slime_ext.envs.base.Environment
    settings: Optional[str] = None  # "package.module:Model", a config Section validating rollout.env_settings


ENVS: dict[str, EnvEntry] = {
    "tools": EnvEntry("slime_ext.envs.tools_env:ToolsEnv", "slime_ext.envs.tools_settings:ToolsSettings"),
}

# Tools the `tools` environment dispatches to: name -> "module:Class" (a slime_ext.envs.toolbox.Tool).
TOOLS: dict[str, str] = {
    "python": "slime_ext.envs.python_tool:PythonTool",
    "calculator": "slime_ext.envs.calculator:CalculatorTool",
}


def load_object(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def register_env(name: str, entry: EnvEntry) -> None:
    """Add an environment at run time (tests, plugins): `rollout.env: name` is then accepted."""
    ENVS[name] = entry


def register_tool(name: str, path: str) -> None:
    """Add a tool at run time: the `tools` environment's `tools` list may then name it."""
    TOOLS[name] = path


def lent_tools() -> dict[str, str]:
    """Tools that methods lend (their registry entries' `tools`): name -> "module:Class". A method builds these
    itself (`Method.env_tools`), since they share its state; the environment gets the objects."""
    from slime_ext.methods.registry import lent_tools as by_methods

    lent = by_methods()
    clash = sorted(set(lent) & set(TOOLS))
    if clash:
        raise ValueError(f"tools {clash} are both registered tools and lent by a method: rename one")
    return lent


def known_tools() -> list[str]:
    """Every tool name the `tools` environment may offer: registered (TOOLS) and lent by a method."""
    return sorted(set(TOOLS) | set(lent_tools()))


def env_entry(name: str) -> EnvEntry:
    if name not in ENVS:
        raise ValueError(f"environment {name!r} is not registered (registered: {sorted(ENVS)})")
    return ENVS[name]


def settings_model(name: str) -> Optional[type]:
    """The settings model of environment `name` (imported now), or None when it takes none."""
    entry = env_entry(name)
    return load_object(entry.settings) if entry.settings else None


def build_env(name: str, settings: dict[str, Any], tokenizer: Any, tools: Optional[dict[str, Any]] = None) -> Any:
    """The environment `name` with its settings validated from the `rollout.env_settings` mapping. `tools`: the
    tool objects the run's method lends (`Method.env_tools`), passed to an environment whose constructor takes a
    `tools` argument (the `tools` environment); one that takes none offers no tools and needs none."""
    model = settings_model(name)
    if model is None and settings:
        raise ValueError(f"environment {name!r} takes no settings, got {sorted(settings)}")
    cls = load_object(env_entry(name).env)
    extra = {"tools": dict(tools)} if tools and "tools" in inspect.signature(cls).parameters else {}
    return cls(model.model_validate(settings) if model else None, tokenizer, **extra)
