"""Tools that fail come back to the model as observations: timeouts, crashes, huge output, a tool that never
returns, busy slots; the python tool runs in the code sandbox; the calculator refuses hostile input fast."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from slime_ext.envs.base import Episode, Turn
from slime_ext.envs.calculator import calculate
from slime_ext.envs.python_tool import PythonTool
from slime_ext.envs.tool_call import format_call, format_observation, parse_tool_call
from slime_ext.envs.toolbox import BUSY, CRASH, ERROR, OK, TIMEOUT, TRUNCATED, UNKNOWN, Tool, ToolBox, ToolError
from slime_ext.envs.tools_env import ToolsEnv
from slime_ext.envs.tools_settings import PythonToolSettings, ToolSettings, ToolsSettings


class Scripted(Tool):
    """A tool doing what the test says: `hang` waits on an event (never returns until the test sets it)."""

    name = "scripted"

    def __init__(self, settings, behaviour, release: threading.Event | None = None):
        super().__init__(settings)
        self.behaviour, self.release = behaviour, release
        self.running = 0
        self.peak = 0
        self._lock = threading.Lock()

    def run(self, arg: str) -> str:
        with self._lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            if self.behaviour == "hang":
                self.release.wait()
                return "late"
            if self.behaviour == "raise":
                raise RuntimeError("tool bug")
            if self.behaviour == "tool_error":
                raise ToolError("bad input")
            if self.behaviour == "huge":
                return "".join(f"line {i}\n" for i in range(100_000))
            if self.behaviour == "slow":
                time.sleep(0.2)
            return f"echo {arg}"
        finally:
            with self._lock:
                self.running -= 1


def box(behaviour, release=None, **limits):
    tool = Scripted(ToolSettings(**limits), behaviour, release)
    return ToolBox({"t": tool}), tool


def test_a_tool_that_never_returns_times_out_and_keeps_its_slot_until_it_ends():
    release = threading.Event()
    tb, tool = box("hang", release, timeout_s=0.5, max_concurrency=1)
    try:
        t0 = time.monotonic()
        first = tb.call("t", "x")
        assert first.kind == TIMEOUT and first.error and "timed out after 0.5 s" in first.text
        assert 0.4 < time.monotonic() - t0 < 2.0
        busy = tb.call("t", "y")  # the hung call still runs: the one slot is taken
        assert busy.kind == BUSY and "busy" in busy.text and tb.in_flight["t"] == 1
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while tb.in_flight["t"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tb.in_flight["t"] == 0
    tool.behaviour = "echo"
    assert tb.call("t", "z").text == "echo z"  # the slot came back when the call ended


def test_a_crash_and_a_tool_error_are_observations_not_exceptions():
    tb, _ = box("raise")
    res = tb.call("t", "x")
    assert res.kind == CRASH and "RuntimeError: tool bug" in res.text
    tb, _ = box("tool_error")
    res = tb.call("t", "x")
    assert res.kind == ERROR and res.text == "bad input"
    unknown = tb.call("nope", "x")
    assert unknown.kind == UNKNOWN and "available tools: t" in unknown.text


def test_huge_output_is_truncated_with_a_marker():
    tb, _ = box("huge", max_output_chars=200)
    res = tb.call("t", "x")
    assert res.kind == OK and len(res.text) <= 200 and res.text.startswith(TRUNCATED)
    assert res.text.endswith("line 99999\n")  # the end is kept


def test_the_concurrency_limit_bounds_calls_in_flight():
    tb, tool = box("slow", timeout_s=30, max_concurrency=2)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: tb.call("t", str(i)), range(8)))
    assert [r.text for r in results] == [f"echo {i}" for i in range(8)]
    assert tool.peak == 2 and tb.peak_in_flight["t"] == 2


def python_tool(timeout_s=3.0, **kw) -> ToolBox:
    return ToolBox({"python": PythonTool(PythonToolSettings(timeout_s=timeout_s, **kw))})


def test_python_tool_runs_in_the_sandbox():
    tb = python_tool()
    assert tb.call("python", "print(6 * 7)").text == "42\n"
    err = tb.call("python", "print('before')\n1/0")
    assert err.kind == ERROR and err.text.startswith("before\n") and "ZeroDivisionError: division by zero" in err.text
    exited = tb.call("python", "import os\nos._exit(3)")
    assert exited.kind == ERROR and "exited with code 3" in exited.text
    net = tb.call("python", "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)")
    assert net.kind == ERROR and "OSError" in net.text  # no network
    memory = tb.call("python", "x = bytearray(2 * 1024 ** 3)")
    assert memory.kind == ERROR and "MemoryError" in memory.text


def test_python_tool_time_and_output_limits():
    tb = python_tool(timeout_s=2.0, max_output_chars=300)
    for code in ("import time\ntime.sleep(1000)", "while True:\n    pass"):
        t0 = time.monotonic()
        res = tb.call("python", code)
        assert res.error and res.kind in (ERROR, TIMEOUT) and time.monotonic() - t0 < 4.0, res
        assert "time limit" in res.text or "timed out" in res.text, res.text
    # the output bound alone, with time to spare: under load (CI beside a study) the sandbox's start and a 1 MB
    # print once took longer than the 2 s above and the call timed out instead
    huge = python_tool(timeout_s=30.0, max_output_chars=300).call("python", "print('x' * 10**6)\nprint('end')")
    assert huge.kind == OK and len(huge.text) <= 300 and huge.text.startswith(TRUNCATED) and huge.text.endswith("end\n")


@pytest.mark.parametrize("expr, value", [("1+2", "3"), ("2^10", "1024"), ("(3+4)*5-2", "33"), ("7/3", "2.33333333333333"),
                                         ("sqrt(16)", "4"), ("-2**2", "-4"), ("2**-3", "0.125"),
                                         ("123456789*987654321", "121932631112635269")])
def test_calculator_on_valid_input(expr, value):
    assert calculate(expr) == value


@pytest.mark.parametrize("expr", ["10**10**10", "9**9**9", "2**2**2**2**2", "10**5000*10**5000", "exp(10**6)",
                                  "__import__('os').system('true')", "(1).__class__", "x + 1", "open('f')",
                                  "[1, 2]", "lambda: 1", "'a' * 3", "1/0", "5 % 0", "(" * 300 + "1" + ")" * 300,
                                  "1" * 5000, "sin(10**20)", "", "().__class__.__bases__[0].__subclasses__()"])
def test_calculator_refuses_hostile_input_fast(expr):
    t0 = time.monotonic()
    with pytest.raises(ToolError):
        calculate(expr)
    assert time.monotonic() - t0 < 1.0


def test_calculator_through_the_toolbox_stays_within_its_limit():
    from slime_ext.envs.calculator import CalculatorTool

    tb = ToolBox({"calculator": CalculatorTool(ToolSettings(timeout_s=2.0))})
    assert tb.call("calculator", "6*7").text == "42"
    t0 = time.monotonic()
    res = tb.call("calculator", "10**10**10")
    assert res.kind == ERROR and "too large" in res.text and time.monotonic() - t0 < 2.0


def test_tool_call_format():
    call = parse_tool_call("Let me compute.\n" + format_call("python", "\nprint(1)\n") + "\n")
    assert call is not None and call.name == "python" and call.arg == "print(1)"
    assert parse_tool_call("<tool> calculator </tool>\n<input>2+2</input>").name == "calculator"
    assert parse_tool_call("no call here") is None
    assert parse_tool_call("<tool>python</tool><input>print(1)") is None  # cut off before the end tag
    assert format_observation("42\n", False) == "\n<output>\n42\n</output>\n"
    assert format_observation("boom", True) == "\n<error>\nboom\n</error>\n"


def test_tools_env_dispatches_answers_errors_and_ends():
    env = ToolsEnv(ToolsSettings(tools=["calculator"]))
    assert env.stop == ("</input>",)
    episode = Episode(row={}, turns_left=3)

    def turn(text, reason="stop"):
        return Turn(0, (), text, reason)

    step = env.step(episode, turn(format_call("calculator", "6*7")))
    assert step.observation == "\n<output>\n42\n</output>\n" and not step.done and step.tool_calls == 1
    step = env.step(episode, turn(format_call("python", "print(1)")))  # not offered here
    assert step.observation.startswith("\n<error>\nunknown tool 'python'") and step.tool_errors == 1
    step = env.step(episode, turn(format_call("calculator", "1/0")))
    assert "<error>" in step.observation and step.tool_errors == 1
    assert env.step(episode, turn("The answer is \\boxed{42}")).done
    assert env.step(episode, turn("<tool>calculator</tool><input>6*", "length")).done  # cut off: final
    episode.turns_left = 0
    last = env.step(episode, turn(format_call("calculator", "6*7")))
    assert not last.done and last.tool_calls == 0 and last.info["unanswered"]
