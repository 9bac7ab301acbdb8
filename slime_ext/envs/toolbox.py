"""Tools and the dispatcher that calls them with limits, so that no tool can crash or stall a rollout.

Every call comes back as a `ToolResult` (text for the model, and whether it failed): an unknown tool, a tool
that raises, one that runs past its time limit or never returns, and one whose slots are all taken each
become an error text, never an exception. Per tool:
- `max_concurrency`: a semaphore bounds the calls in flight. A call that never returns keeps its slot until it
  does (the bound counts calls that are really running); the python tool's sandbox kills its program at the
  limit, so its calls always end;
- `timeout_s`: the whole call, waiting for a slot included. The tool runs in its own daemon thread; past the
  limit the caller stops waiting and reports a timeout;
- `max_output_chars`: longer output keeps its last characters after the marker `...[truncated]`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

TRUNCATED = "...[truncated]"
"""Marks output whose beginning was cut (the code sandbox uses the same marker for its own cap)."""

OK, ERROR, TIMEOUT, BUSY, UNKNOWN, CRASH = "ok", "error", "timeout", "busy", "unknown_tool", "crash"


class ToolError(Exception):
    """A failure the tool reports to the model (bad input, a program that raised); its message is shown."""


class Tool:
    """A tool: `run(arg) -> output text`, raising ToolError for a failure the model should read.

    Built as `cls(settings)` with the tool's settings section (timeout_s, max_concurrency, max_output_chars and
    anything of its own); a tool a method lends (`slime_ext.methods.registry`, `MethodEntry.tools`) is built by
    the method and carries the same limits in `settings`. `run` may be called from several threads at once (up
    to max_concurrency)."""

    name = "tool"

    def __init__(self, settings: Any):
        self.settings = settings

    def run(self, arg: str) -> str:
        raise NotImplementedError

    def run_for(self, episode: Any, arg: str) -> str:
        """`run` for one episode (`slime_ext.envs.base.Episode`, to read, not to change). A tool whose answer
        depends on the episode's data row overrides this (a stronger model asked the prompt's question, say);
        the others ignore the episode."""
        return self.run(arg)


@dataclass(frozen=True)
class ToolResult:
    text: str  # what the model reads (output, or the error message)
    kind: str  # ok | error | timeout | busy | unknown_tool | crash
    seconds: float

    @property
    def error(self) -> bool:
        return self.kind != OK


def truncate(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, keeping its end after the TRUNCATED marker."""
    if len(text) <= limit:
        return text
    keep = max(limit - len(TRUNCATED) - 1, 0)
    return TRUNCATED + "\n" + (text[-keep:] if keep else "")


class _Call:
    """One call running in its own thread; the thread frees the tool's slot when the call ends."""

    def __init__(self, tool: Tool, arg: str, episode: Any, slot: threading.Semaphore, done_hook: Any):
        self.done = threading.Event()
        self.output: Optional[str] = None
        self.exc: Optional[BaseException] = None
        self._tool, self._arg, self._episode, self._slot, self._done_hook = tool, arg, episode, slot, done_hook
        threading.Thread(target=self._run, name=f"tool-{tool.name}", daemon=True).start()

    def _run(self) -> None:
        try:
            self.output = self._tool.run_for(self._episode, self._arg)
        except BaseException as exc:  # noqa: BLE001 - reported to the model, never raised in the rollout
            self.exc = exc
        finally:
            self._done_hook()
            self._slot.release()
            self.done.set()


class ToolBox:
    """Named tools behind their limits. Thread-safe: episodes call tools concurrently."""

    def __init__(self, tools: dict[str, Tool]):
        self.tools = dict(tools)
        self._slots = {name: threading.Semaphore(int(t.settings.max_concurrency)) for name, t in self.tools.items()}
        self._lock = threading.Lock()
        self.in_flight = {name: 0 for name in self.tools}
        self.peak_in_flight = {name: 0 for name in self.tools}  # the most calls of a tool running at once

    def _started(self, name: str) -> None:
        with self._lock:
            self.in_flight[name] += 1
            self.peak_in_flight[name] = max(self.peak_in_flight[name], self.in_flight[name])

    def _ended(self, name: str) -> None:
        with self._lock:
            self.in_flight[name] -= 1

    def call(self, name: str, arg: str, episode: Any = None) -> ToolResult:
        """Run tool `name` on `arg` (for `episode`, when the call comes from one) within its limits; never raises."""
        start = time.monotonic()
        tool = self.tools.get(name)
        if tool is None:
            return ToolResult(f"unknown tool {name!r}; available tools: {', '.join(sorted(self.tools))}", UNKNOWN, 0.0)
        limits = tool.settings
        deadline = start + float(limits.timeout_s)
        if not self._slots[name].acquire(timeout=float(limits.timeout_s)):
            return ToolResult(f"tool {name!r} is busy: {limits.max_concurrency} call(s) in flight, none ended within "
                              f"{limits.timeout_s:g} s", BUSY, time.monotonic() - start)
        self._started(name)
        call = _Call(tool, arg, episode, self._slots[name], lambda: self._ended(name))
        finished = call.done.wait(timeout=max(deadline - time.monotonic(), 0.0))
        took = time.monotonic() - start
        if not finished:
            return ToolResult(f"tool {name!r} timed out after {limits.timeout_s:g} s", TIMEOUT, took)
        if isinstance(call.exc, ToolError):
            return ToolResult(truncate(str(call.exc), limits.max_output_chars), ERROR, took)
        if call.exc is not None:
            text = f"tool {name!r} failed: {type(call.exc).__name__}: {call.exc}"
            return ToolResult(truncate(text, limits.max_output_chars), CRASH, took)
        output = call.output if isinstance(call.output, str) else str(call.output)
        return ToolResult(truncate(output, limits.max_output_chars), OK, took)
