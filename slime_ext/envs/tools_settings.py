"""`rollout.env_settings` of the `tools` environment: which tools it offers and each tool's limits.

Imported by config validation (through the environment registry), so it holds only pydantic models."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from slime_ext.config.sections import Section


class ToolSettings(Section):
    """The limits every tool call runs under (slime_ext.envs.toolbox)."""

    timeout_s: float = Field(5.0, gt=0, le=600)  # the whole call, waiting for a free slot included
    max_concurrency: int = Field(4, ge=1)  # calls of this tool in flight at once, over all episodes
    max_output_chars: int = Field(1000, ge=32)  # longer output keeps its end after "...[truncated]"


class PythonToolSettings(ToolSettings):
    timeout_s: float = Field(5.0, ge=2, le=600)  # the program gets this minus the sandbox's start-up grace
    memory_mb: int = Field(512, ge=64)  # the program's address-space limit


class ToolsSettings(Section):
    tools: list[str] = Field(default_factory=lambda: ["python", "calculator"], min_length=1)
    python: PythonToolSettings = Field(default_factory=PythonToolSettings)
    calculator: ToolSettings = Field(default_factory=lambda: ToolSettings(timeout_s=2.0))

    @model_validator(mode="after")
    def _check_tools(self) -> "ToolsSettings":
        from slime_ext.envs.registry import known_tools

        known = known_tools()
        unknown = [t for t in self.tools if t not in known]
        if unknown:
            raise ValueError(f"tools {unknown} are not registered (registered, or lent by a method: {known})")
        if len(set(self.tools)) != len(self.tools):
            raise ValueError(f"tools lists a tool twice: {self.tools}")
        unused = [k for k in ("python", "calculator") if k in self.model_fields_set and k not in self.tools]
        if unused:
            raise ValueError(f"settings for {unused} are given but tools = {self.tools} does not offer them: "
                             "they would change nothing")
        return self

    def tool_settings(self, name: str) -> Any:
        """The limits of tool `name` (a registered tool without its own section gets the defaults)."""
        return getattr(self, name, None) or ToolSettings()
