"""Synthetic (x, r, a) triples for SxS from the synthetic math task.

Reasoning: the solution's steps, one paragraph each. Answer: a short user-facing account whose blocks
become derivable at different points of the reasoning (an opening that needs nothing, one running
total per step, the final boxed answer), with `requires` telling the rule oracle which step each
block needs.
"""

from __future__ import annotations

import re
from typing import Iterable

_STEP = re.compile(r"^Step (\d+): .*= (-?\d+)\.$")


def triple_from_row(row: dict) -> dict:
    """One SxS triple from a synthetic math row (`prompt`, `solution` with `Step k:` lines, `label`)."""
    lines = [ln.strip() for ln in re.split(r"\n+", row["solution"]) if ln.strip()]
    steps = [ln for ln in lines if _STEP.match(ln)]
    if not steps:
        raise ValueError(f"row {row.get('id')}: no 'Step k: ... = v.' lines in the solution")
    answer, requires = ["Let me work through it."], [-1]
    for k, step in enumerate(steps):
        value = _STEP.match(step).group(2)
        answer.append(f"After step {k + 1} the count is {value}.")
        requires.append(k)
    answer.append(f"So the answer is \\boxed{{{row['label']}}}.")
    requires.append(len(steps) - 1)
    return {"id": str(row.get("id", row["prompt"][:40])), "question": row["prompt"], "reasoning": "\n\n".join(steps),
            "answer": "\n\n".join(answer), "label": str(row["label"]), "requires": requires}


def synthetic_triples(rows: Iterable[dict]) -> list[dict]:
    return [triple_from_row(r) for r in rows]
