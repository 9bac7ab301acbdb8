r"""One v2 problem from one seeded RNG: the story, the step solution, the answer, maybe a re-check tail.

The story has v1's shape (a start sentence, one sentence per operation, a question) over the shared closed
vocabulary; the solution has exactly ``level.n_steps`` ``Step k:`` lines in varied phrasing
(`slime_ext.tasks.v2.phrasing`), then ``\boxed{N}``, then, for a share of rows, a re-check tail
(`slime_ext.tasks.v2.recheck`).

The tail is decided by the last two draws of the row's RNG, after everything else: the prompt, label and
steps of a row never depend on ``recheck_share``, and the rows with a tail at share s are a subset of those
with a tail at any larger share.
"""

from __future__ import annotations

import random

from slime_ext.tasks.story_vocab import CONNECTORS, OBJECTS, PEOPLE, QUESTION_TEMPLATES, START_TEMPLATES, cap
from slime_ext.tasks.v2.levels import StepLevel
from slime_ext.tasks.v2.phrasing import STEP_TEMPLATES, STORY_PHRASES, apply_op, render_step
from slime_ext.tasks.v2.recheck import render_tail

__all__ = ["MIN_VALUE", "choose_op", "generate_v2_problem"]

MIN_VALUE = 2  # every running total: the story and the steps never speak of "1 apples" or "0 apples"


def _divisors(value: int, lo: int, hi: int) -> list[int]:
    """Divisors d of `value` with lo <= d <= hi that leave a quotient of at least MIN_VALUE."""
    return [d for d in range(lo, min(hi, value // MIN_VALUE) + 1) if value % d == 0]


def choose_op(rng: random.Random, level: StepLevel, value: int) -> tuple[str, int]:
    """An (op, operand) keeping the running value in ``MIN_VALUE..max_value``: drawn uniformly among the
    level's operations that fit `value` (StepLevel's checks guarantee "+" or "-" always fits)."""
    cap_, omin = level.max_value, level.operand_min
    divisors = _divisors(value, level.factor_min, level.factor_max) if "/" in level.ops else []
    fits = {
        "+": value + omin <= cap_,
        "-": value - omin >= MIN_VALUE,
        "*": "*" in level.ops and value * level.factor_min <= cap_,
        "/": bool(divisors),
    }
    op = rng.choice([o for o in level.ops if fits[o]])
    if op == "+":
        return op, rng.randint(omin, min(level.operand_max, cap_ - value))
    if op == "-":
        return op, rng.randint(omin, min(level.operand_max, value - MIN_VALUE))
    if op == "*":
        return op, rng.randint(level.factor_min, min(level.factor_max, cap_ // value))
    return op, rng.choice(divisors)


def generate_v2_problem(rng: random.Random, level: StepLevel, idx: int, split: str = "train",
                        recheck_share: float = 0.0) -> dict:
    """Draw one v2 row from `rng` (consumed deterministically). Fields as v1's rows (``id``, ``prompt``,
    ``label``, ``solution``, ``level``, ``num_steps``, ``task``) plus ``recheck``: whether it has a tail."""
    if not 0.0 <= recheck_share <= 1.0:
        raise ValueError(f"recheck_share must be in [0, 1], got {recheck_share}")
    name, pron = rng.choice(PEOPLE)
    obj = rng.choice(OBJECTS)
    value = rng.randint(level.start_min, level.start_max)
    story = [rng.choice(START_TEMPLATES).format(name=name, n=value, obj=obj)]
    lines: list[str] = []
    steps: list[tuple[int, str, int, int]] = []
    for k in range(1, level.n_steps + 1):
        op, b = choose_op(rng, level, value)
        phrase = rng.choice(STORY_PHRASES[op]).format(b=b)
        lead = cap(pron) if k == 1 else f"{rng.choice(CONNECTORS)} {pron}"
        story.append(f"{lead} {phrase}.")
        new_value = apply_op(value, op, b)
        template = rng.choice(STEP_TEMPLATES[op])
        lines.append(render_step(template, k=k, who=name if k == 1 else pron, pron=pron, phrase=phrase, obj=obj,
                                 a=value, op=op, b=b, c=new_value))
        steps.append((value, op, b, new_value))
        value = new_value
    story.append(rng.choice(QUESTION_TEMPLATES).format(obj=obj, name=name))
    lines.append(f"\\boxed{{{value}}}")
    # Last draws: whether this row has a tail, and which (both always drawn; see the module docstring).
    recheck = rng.random() < recheck_share
    tail = render_tail(rng, steps)
    if recheck:
        lines.append(tail)
    return {
        "id": f"{level.name}-{split}-{idx}",
        "prompt": " ".join(story),
        "label": str(value),
        "solution": "\n".join(lines),
        "level": level.name,
        "num_steps": level.n_steps,
        "task": "math",
        "recheck": recheck,
    }
