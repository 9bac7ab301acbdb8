"""The `tools` environment: a turn that ends with a tool call gets the tool's answer; one without ends the
episode (its text is the final answer). The call format is in `tool_call.py`, the limits in `toolbox.py`.

Its tools are the registered ones (`slime_ext.envs.registry.TOOLS`, built from their settings) and the ones the
run's method lends (`MethodEntry.tools` in the method registry): those are objects the method built, sharing its
state, handed in as `tools`."""

from __future__ import annotations

from typing import Any, Optional

from slime_ext.envs.base import Environment, EnvStep, Episode, Turn
from slime_ext.envs.registry import TOOLS, load_object
from slime_ext.envs.tool_call import STOP_STRINGS, format_observation, parse_tool_call
from slime_ext.envs.toolbox import Tool, ToolBox
from slime_ext.envs.tools_settings import ToolsSettings


class ToolsEnv(Environment):
    stop = STOP_STRINGS

    def __init__(self, settings: Optional[ToolsSettings] = None, tokenizer: Optional[Any] = None,
                 tools: Optional[dict[str, Tool]] = None):
        """`tools`: tool objects a method lends (name -> Tool); only those `settings.tools` offers are used."""
        settings = settings or ToolsSettings()
        super().__init__(settings, tokenizer)
        self.toolbox = ToolBox({name: self._tool(name, settings, tools or {}) for name in settings.tools})

    @staticmethod
    def _tool(name: str, settings: ToolsSettings, lent: dict[str, Tool]) -> Tool:
        if name in TOOLS:
            return load_object(TOOLS[name])(settings.tool_settings(name))
        if name not in lent:
            raise ValueError(f"tool {name!r} is one a method lends (its registry entry's `tools`), and none was lent "
                             f"to this environment (lent: {sorted(lent)}); the run's method builds it "
                             "(Method.env_tools)")
        return lent[name]

    def step(self, episode: Episode, turn: Turn) -> EnvStep:
        call = parse_tool_call(turn.text) if turn.finish_reason == "stop" else None
        if call is None:
            return EnvStep(done=True)
        if episode.turns_left == 0:  # no turn would read the answer: the call is not run
            return EnvStep(info={"tool": call.name, "unanswered": True})
        result = self.toolbox.call(call.name, call.arg, episode)
        return EnvStep(observation=format_observation(result.text, result.error), tool_calls=1,
                       tool_errors=int(result.error),
                       info={"tool": call.name, "result": result.kind, "seconds": round(result.seconds, 3)})
