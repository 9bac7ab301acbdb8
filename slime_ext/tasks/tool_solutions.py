"""Reference solutions that call a tool: the warm start that shows the model the tool-call format.

A synthetic row's step solution (``Step k: ... so a op b = c.`` lines, then ``\\boxed{N}``) becomes one call of
the `tools` environment's format with the whole computation as one expression, the environment's answer, and
the final answer:

    <tool>calculator</tool><input>262*66+526</input>
    <output>
    17818
    </output>
    \\boxed{17818}

(`python`: ``print(262*66+526)``). Everything between ``</input>`` and ``\\boxed`` is exactly the observation
the environment appends (`slime_ext.envs.tool_call.format_observation`; the tasks layer may not import the
environments, so the format is written here too and a test keeps the two equal). The SFT builder
(`slime_ext.tasks.response_tokens`) gives those tokens loss mask 0: they are the environment's, not the model's.
Prompt, label and level stay those of the step row, so a run without tools sees the same problems.
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = ["SolutionTool", "SOLUTION_TOOLS", "expression", "tool_solution", "with_tool_solution"]

SolutionTool = Literal["calculator", "python"]
SOLUTION_TOOLS: tuple[str, ...] = ("calculator", "python")
_STEP = re.compile(r"so (-?\d+) ([+\-*]) (\d+) = (-?\d+)\.$")
_BOXED = re.compile(r"\\boxed\{(-?\d+)\}$")


def _steps(solution: str) -> tuple[list[tuple[int, str, int, int]], int]:
    """((a, op, b, c) per step line, the boxed answer) of a generator's step solution."""
    lines = solution.strip().split("\n")
    steps = []
    for line in lines[:-1]:
        found = _STEP.search(line.strip())
        if found is None:
            raise ValueError(f"not a step line of a synthetic solution: {line!r}")
        steps.append((int(found.group(1)), found.group(2), int(found.group(3)), int(found.group(4))))
    boxed = _BOXED.search(lines[-1].strip())
    if boxed is None or not steps:
        raise ValueError(f"not a synthetic step solution (steps, then \\boxed{{N}}): {solution!r}")
    return steps, int(boxed.group(1))


def expression(solution: str) -> tuple[str, int]:
    """(one arithmetic expression computing the steps left to right, its value) of a step solution. Brackets only
    where a product follows a sum or difference: ``(a+b)*c``, but ``a*b+c``."""
    steps, answer = _steps(solution)
    expr, value, additive = str(steps[0][0]), steps[0][0], False
    for a, op, b, c in steps:
        if a != value:
            raise ValueError(f"step {a} {op} {b} = {c} does not continue from {value}")
        if op == "*":
            expr, additive = (f"({expr})*{b}" if additive else f"{expr}*{b}"), False
        else:
            expr, additive = f"{expr}{op}{b}", True
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        if value != c:
            raise ValueError(f"step {a} {op} {b} = {c} is wrong")
    if value != answer:
        raise ValueError(f"the steps give {value}, the solution's answer is {answer}")
    return expr, value


def _observation(text: str) -> str:
    """The tools environment's answer to a call that printed `text` (format_observation, error=False)."""
    return f"\n<output>\n{text}\n</output>\n"


def tool_solution(solution: str, tool: SolutionTool) -> str:
    """The tool-call version of a step solution: the call, the environment's observation, ``\\boxed{N}``."""
    expr, value = expression(solution)
    if tool == "calculator":
        arg = expr
    elif tool == "python":
        arg = f"print({expr})"
    else:
        raise ValueError(f"no tool solutions for tool {tool!r} (known: {list(SOLUTION_TOOLS)})")
    return f"<tool>{tool}</tool><input>{arg}</input>{_observation(str(value))}\\boxed{{{value}}}"


def with_tool_solution(row: dict, tool: SolutionTool) -> dict:
    """The row with its solution replaced by the tool-call version (and `tool` recorded)."""
    return dict(row, solution=tool_solution(row["solution"], tool), tool=tool)
