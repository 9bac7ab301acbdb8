"""The tool-call format of the `tools` environment, in one place.

A model turn calls a tool by ending with

    <tool>NAME</tool><input>ARGUMENT</input>

(whitespace around NAME is ignored; ARGUMENT is taken verbatim, without the newlines right after `<input>` and
right before `</input>`). `</input>` is the turn's stop string, so the engine ends the turn right there. The
environment answers with the tool's output or its error, appended after the call:

    <output>
    TEXT
    </output>

or, when the tool failed (an error, a timeout, a crash, an unknown tool, all slots busy):

    <error>
    TEXT
    </error>

A turn that ends without a call (EOS, or its token budget) is the model's final answer and ends the episode.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

CALL_END = "</input>"
STOP_STRINGS = (CALL_END,)

_CALL = re.compile(r"<tool>\s*([^<>\s]*)\s*</tool>\s*<input>(.*?)</input>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arg: str


def parse_tool_call(text: str) -> Optional[ToolCall]:
    """The call a turn ends with, or None. The turn stops at the first `</input>`, so a turn holds at most one
    complete call, at its end (after it at most what the stop token carried past the tag, e.g. a newline)."""
    found = _CALL.search(text)
    if found is None:
        return None
    arg = found.group(2)
    arg = arg[1:] if arg.startswith("\n") else arg
    arg = arg[:-1] if arg.endswith("\n") else arg
    return ToolCall(found.group(1), arg)


def without_calls(text: str) -> str:
    """`text` with every complete tool call taken out: what the model wrote besides its requests."""
    return _CALL.sub("", text)


def format_call(name: str, arg: str) -> str:
    """A call written in the format (warm-start data, tests, docs)."""
    return f"<tool>{name}</tool><input>{arg}</input>"


def format_observation(text: str, error: bool) -> str:
    """The observation text appended after a call."""
    tag = "error" if error else "output"
    body = text if text.endswith("\n") or not text else text + "\n"
    return f"\n<{tag}>\n{body}</{tag}>\n"
