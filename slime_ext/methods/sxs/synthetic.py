"""Synthetic (x, r, a) triples for SxS from the synthetic math task.

Reasoning: the solution's steps, one paragraph each, then the re-check tail of a v2 reference (`Check: ...`, after
its `\\boxed{}` line) as one more paragraph when it has one. Answer: a short user-facing account whose blocks
become derivable at different points of the reasoning (an opening that needs nothing, the running total after
each disclosed step, the final boxed answer), with `requires` telling the rule oracle which step each block needs.

`disclosure_share` < 1 reports the running total after only some of the intermediate steps (each kept with that
probability, drawn from the row's id, so a row's account never changes between builds): think blocks then span
one to several steps and the number of blocks varies within a level, which is what lets RL (and the QP shaping,
which favours a shorter longest think block) change the pacing instead of inheriting one block per step.
"""

from __future__ import annotations

import random
import re
import zlib
from typing import Iterable

_STEP = re.compile(r"^Step (\d+): .*= (-?\d+)\.$")
_BOXED = re.compile(r"^\\boxed\{[^}]*\}$")


def disclosed_steps(row_id: str, n_steps: int, disclosure_share: float) -> list[int]:
    """The 0-based steps whose running total the account reports: the last always; each earlier one with
    probability `disclosure_share`, drawn from a generator seeded by the row's id (CRC-32)."""
    if not 0 < disclosure_share <= 1:
        raise ValueError(f"disclosure_share must be in (0, 1], got {disclosure_share}")
    rng = random.Random(zlib.crc32(row_id.encode()))
    return [k for k in range(n_steps) if k == n_steps - 1 or rng.random() < disclosure_share]


def triple_from_row(row: dict, disclosure_share: float = 1.0) -> dict:
    """One SxS triple from a synthetic math row (`prompt`, `solution` with `Step k:` lines, `label`)."""
    lines = [ln.strip() for ln in re.split(r"\n+", row["solution"]) if ln.strip()]
    steps = [ln for ln in lines if _STEP.match(ln)]
    if not steps:
        raise ValueError(f"row {row.get('id')}: no 'Step k: ... = v.' lines in the solution")
    boxed = next((i for i, ln in enumerate(lines) if _BOXED.match(ln)), None)
    tail = " ".join(lines[boxed + 1:]) if boxed is not None else ""
    row_id = str(row.get("id", row["prompt"][:40]))
    answer, requires = ["Let me work through it."], [-1]
    for k in disclosed_steps(row_id, len(steps), disclosure_share):
        value = _STEP.match(steps[k]).group(2)
        answer.append(f"After step {k + 1} the count is {value}.")
        requires.append(k)
    answer.append(f"So the answer is \\boxed{{{row['label']}}}.")
    requires.append(len(steps) - 1)
    reasoning = steps + ([tail] if tail else [])
    return {"id": row_id, "question": row["prompt"], "reasoning": "\n\n".join(reasoning),
            "answer": "\n\n".join(answer), "label": str(row["label"]), "requires": requires}


def synthetic_triples(rows: Iterable[dict]) -> list[dict]:
    return [triple_from_row(r) for r in rows]
