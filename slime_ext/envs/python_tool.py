"""The `python` tool: runs the model's program in the code verifier's sandbox and returns what it printed.

The sandbox is `slime_ext.rewards.code_sandbox.run_candidate` (bubblewrap: no network, a private writable
directory, no view of the repository or /etc; rlimits on address space, CPU seconds, file size and processes;
a wall-clock deadline that kills the whole process group), with no tests to run: the program is the whole
input. Its stdout comes back; a program that raises, runs out of time or memory, or exits non-zero comes back
as a ToolError whose text holds what it printed and why it ended.
"""

from __future__ import annotations

import signal

from slime_ext.envs.toolbox import Tool, ToolError
from slime_ext.rewards.code_sandbox import STARTUP_GRACE_S, run_candidate

CALL_MARGIN_S = 0.5
"""Kept between the sandbox's own deadline and the call's limit, so the sandbox reports the timeout."""

_SIGNALS = {int(signal.SIGXCPU): "its CPU time limit", int(signal.SIGKILL): "a kill (time or memory limit)",
            int(signal.SIGXFSZ): "its output size limit", int(signal.SIGSEGV): "a segmentation fault"}


def program_time_limit(timeout_s: float) -> float:
    """The program's limit inside a call of `timeout_s` seconds (the sandbox adds its start-up grace)."""
    return max(float(timeout_s) - STARTUP_GRACE_S - CALL_MARGIN_S, 0.1)


class PythonTool(Tool):
    name = "python"

    def run(self, arg: str) -> str:
        code = arg.strip("\n")
        if not code.strip():
            raise ToolError("no code was given: put a Python program between <input> and </input>")
        limit = program_time_limit(self.settings.timeout_s)
        outcome = run_candidate(code, [], time_limit_s=limit, memory_limit_mb=int(self.settings.memory_mb))
        printed = outcome.stdout
        failure = next((r for r in outcome.records if "phase" in r), None)
        if outcome.timed_out:
            why = f"TimeoutError: the program ran past its time limit of {limit:g} s"
        elif failure is not None:
            why = str(failure.get("error", "")).removeprefix("solution: ")
        elif any(r.get("done") for r in outcome.records):
            return printed
        else:
            rc = outcome.returncode
            reason = _SIGNALS.get(-rc if rc is not None and rc < 0 else -1)
            why = f"the program ended by {reason}" if reason else f"the program exited with code {rc}"
            tail = outcome.stderr.strip().splitlines()[-3:]
            if tail:
                why += "\n" + "\n".join(tail)
        raise ToolError((printed + ("\n" if printed and not printed.endswith("\n") else "") + why).strip("\n"))
