"""Deterministic multi-step arithmetic word problems with difficulty levels.

Why this exists: the stack is exercised end to end (tokenizer -> SFT -> RL) on a
tiny model on a 2-core CPU. That needs a task whose difficulty can be dialled
precisely, whose answers are checkable exactly, and whose text uses a small
closed vocabulary so that a locally trained tokenizer covers it completely.

Every problem is a short story about one person and one kind of object. The
reference solution has one ``Step k:`` line per operation, each ending with the
explicit equation ``a op b = c``, then a ``\\boxed{N}`` line.

Two families share this module's loader path: v1 (levels ``L0``-``L5`` and the tools task's ``T1``-``T2``,
defined here, one fixed step phrasing) and task family v2 (``V2``-``V10``, `slime_ext.tasks.v2`: exactly
that many steps, varied phrasing, exact division, an optional re-check tail). `generate_dataset` mixes any
of them by name.

Generation is a pure function of ``(levels, n, seed, split)``: every candidate
problem draws from its own ``random.Random`` seeded with a string, never the
global RNG. Held-out splits ("eval", "test") are generated first, in their own
seed space, and the train split skips any prompt that also appears in the first
``heldout_reserve`` rows of a held-out split of the same seed, so train and eval
never share a prompt text.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from slime_ext.tasks.story_vocab import (
    CONNECTORS as _CONNECTORS,
    OBJECTS as _OBJECTS,
    OP_PHRASES as _OP_PHRASES,
    PEOPLE as _PEOPLE,
    QUESTION_TEMPLATES as _QUESTION_TEMPLATES,
    START_TEMPLATES as _START_TEMPLATES,
    cap as _cap,
)
from slime_ext.tasks.v2.generator import generate_v2_problem
from slime_ext.tasks.v2.levels import V2_LEVELS, StepLevel
from slime_ext.tasks.v2.recheck import DEFAULT_RECHECK_SHARE
from slime_ext.tasks.v2.solver import solve_v2_story

__all__ = [
    "MathLevel",
    "LEVELS",
    "TOOL_LEVELS",
    "ALL_LEVELS",
    "V2_LEVELS",
    "DEFAULT_LEVEL",
    "DEFAULT_RECHECK_SHARE",
    "HELDOUT_SPLITS",
    "generate_problem",
    "generate_dataset",
    "level_row_counts",
    "weighted_level_order",
    "solve_story",
    "write_jsonl",
    "main",
]


@dataclass(frozen=True)
class MathLevel:
    """One difficulty setting.

    ``operand_min..operand_max`` bounds the starting amount and every ``+``/``-``
    operand; ``*`` uses a small factor in ``mult_min..mult_max`` instead so that
    numbers stay short. ``max_value`` caps every running total (an operation
    that would exceed it is replaced by another one).
    """

    name: str
    min_ops: int
    max_ops: int
    operand_min: int
    operand_max: int
    ops: tuple[str, ...]
    mult_min: int = 2
    mult_max: int = 9
    max_value: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.min_ops <= self.max_ops:
            raise ValueError(f"{self.name}: need 1 <= min_ops <= max_ops")
        if not 1 <= self.operand_min <= self.operand_max:
            raise ValueError(f"{self.name}: need 1 <= operand_min <= operand_max")
        if not self.ops or any(op not in ("+", "-", "*") for op in self.ops):
            raise ValueError(f"{self.name}: ops must be a non-empty subset of + - *")
        # Feasibility guarantees for _choose_op: "+" is always possible below the cap,
        # and "-" is possible whenever "+" would cross the cap.
        if "+" not in self.ops:
            raise ValueError(f"{self.name}: ops must contain +")
        if self.max_value is not None and "-" not in self.ops:
            raise ValueError(f"{self.name}: a max_value needs - in ops")
        if not 2 <= self.mult_min <= self.mult_max:
            raise ValueError(f"{self.name}: need 2 <= mult_min <= mult_max")
        if self.max_value is not None and self.max_value < 2 * self.operand_max:
            raise ValueError(f"{self.name}: max_value must be >= 2 * operand_max")


# Ordered easy -> hard; dict order is the curriculum order.
LEVELS: dict[str, MathLevel] = {
    lvl.name: lvl
    for lvl in (
        MathLevel("L0", 1, 2, 1, 9, ("+", "-")),
        MathLevel("L1", 2, 3, 1, 20, ("+", "-")),
        # Calibrated default: a 3.4M-param MoE with per-digit tokens reaches
        # 35-40% greedy accuracy after SFT, leaving headroom for RL.
        MathLevel("L2", 2, 3, 1, 49, ("+", "-")),
        MathLevel("L3", 3, 4, 1, 49, ("+", "-", "*"), mult_min=2, mult_max=5, max_value=999),
        MathLevel("L4", 4, 6, 1, 99, ("+", "-", "*"), mult_min=2, mult_max=9, max_value=999),
        MathLevel("L5", 6, 8, 1, 99, ("+", "-", "*"), mult_min=2, mult_max=9, max_value=999),
    )
}
# Levels for the tools task (issue 31): numbers too long for the tiny model to multiply or add in its head
# (3-4 digit amounts, two-digit factors, results up to 5-7 digits), easy with the calculator. Their own family,
# outside the curriculum order of LEVELS; `slime_ext.tasks.tool_solutions` writes their tool-call solutions.
TOOL_LEVELS: dict[str, MathLevel] = {
    lvl.name: lvl
    for lvl in (
        MathLevel("T1", 2, 2, 100, 999, ("+", "-", "*"), mult_min=11, mult_max=99, max_value=99_999),
        MathLevel("T2", 3, 4, 1000, 9999, ("+", "-", "*"), mult_min=11, mult_max=99, max_value=9_999_999),
    )
}
# Task family v2 (slime_ext/tasks/v2): V2..V10, the number of steps of every row; phrasing and a re-check tail vary.
ALL_LEVELS: dict[str, MathLevel | StepLevel] = {**LEVELS, **TOOL_LEVELS, **V2_LEVELS}
DEFAULT_LEVEL = "L2"
HELDOUT_SPLITS: tuple[str, ...] = ("eval", "test")
DEFAULT_HELDOUT_RESERVE = 2000

_SYMBOL_TO_FN = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def _choose_op(rng: random.Random, level: MathLevel, value: int) -> tuple[str, int]:
    """Pick an (op, operand) keeping 0 <= running value <= max_value.

    The op is drawn uniformly from the level's ops; if it cannot be applied
    (subtracting from a value below operand_min, a product over the cap, adding
    past the cap) the first feasible op of "-", "+", "*" is used instead.
    """
    cap = level.max_value
    lo, hi = level.operand_min, level.operand_max
    f_hi = level.mult_max if cap is None else min(level.mult_max, cap // max(value, 1))
    feasible = {
        "+": "+" in level.ops and (cap is None or value + lo <= cap),
        "-": "-" in level.ops and value >= lo,
        "*": "*" in level.ops and value >= 1 and f_hi >= level.mult_min,
    }
    op = rng.choice(level.ops)
    if not feasible[op]:
        op = next(o for o in ("-", "+", "*") if feasible[o])  # MathLevel checks guarantee one
    if op == "*":
        return "*", rng.randint(level.mult_min, f_hi)
    if op == "+":
        return "+", rng.randint(lo, hi if cap is None else min(hi, cap - value))
    return "-", rng.randint(lo, min(hi, value))


def generate_problem(rng: random.Random, level: MathLevel, idx: int, split: str = "train") -> dict:
    """Draw one problem from ``rng`` (consumed deterministically) for ``level``."""
    name, pron = rng.choice(_PEOPLE)
    obj = rng.choice(_OBJECTS)
    n_ops = rng.randint(level.min_ops, level.max_ops)
    # Start at >= 2 so the story never says "1 apples".
    value = rng.randint(max(2, level.operand_min), max(2, level.operand_max))
    story = [rng.choice(_START_TEMPLATES).format(name=name, n=value, obj=obj)]
    steps: list[str] = []
    for k in range(n_ops):
        op, b = _choose_op(rng, level, value)
        phrase = rng.choice(_OP_PHRASES[op]).format(b=b)
        if k == 0:
            story.append(f"{_cap(pron)} {phrase}.")
            subject = name
        else:
            story.append(f"{rng.choice(_CONNECTORS)} {pron} {phrase}.")
            subject = _cap(pron)
        new_value = _SYMBOL_TO_FN[op](value, b)
        steps.append(f"Step {k + 1}: {subject} {phrase}, so {value} {op} {b} = {new_value}.")
        value = new_value
    story.append(rng.choice(_QUESTION_TEMPLATES).format(obj=obj, name=name))
    steps.append(f"\\boxed{{{value}}}")
    return {
        "id": f"{level.name}-{split}-{idx}",
        "prompt": " ".join(story),
        "label": str(value),
        "solution": "\n".join(steps),
        "level": level.name,
        "num_steps": n_ops,
        "task": "math",
    }


# --- exact solver ------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _story_patterns() -> tuple[re.Pattern, re.Pattern, dict[tuple[str, str], str]]:
    """(start sentence, operation phrase, (text before, text after the operand) -> op)."""
    names, objs = "|".join(n for n, _ in _PEOPLE), "|".join(_OBJECTS)
    starts = [re.escape(t).replace(r"\{name\}", f"(?P<name{i}>{names})").replace(r"\{n\}", rf"(?P<n{i}>\d+)")
              .replace(r"\{obj\}", f"(?:{objs})") for i, t in enumerate(_START_TEMPLATES)]
    phrase_op = {tuple(ph.split("{b}")): op for op, phrases in _OP_PHRASES.items() for ph in phrases}
    alternatives = sorted((re.escape(ph).replace(r"\{b\}", r"\d+") for phrases in _OP_PHRASES.values()
                           for ph in phrases), key=len, reverse=True)
    return re.compile("|".join(starts)), re.compile("|".join(alternatives)), phrase_op


def solve_story(text: str) -> str | None:
    """The solution (``Step k:`` lines, then ``\\boxed{N}``) of the last problem in ``text``, of either family:
    the exact "cloud model" of DA-GRPO's embedded studies (`slime_ext.engine.solver.SOLVERS`) answers through it.

    The one place that dispatches between the families. A story in the generators' grammar is read by
    `solve_v2_story` (strict; v2's vocabulary holds v1's and its solution line is v1's step line, so a v1
    story gets v1's reference byte for byte, and a V2/V3 story, which may be word for word a v1 story, needs
    no family decision). Text it refuses goes to v1's lenient reader as before (`_solve_v1_story`: the v1
    phrases between the last start sentence and the next "?"). None when neither finds a story.
    """
    solution = solve_v2_story(text)
    return solution if solution is not None else _solve_v1_story(text)


def _solve_v1_story(text: str) -> str | None:
    """v1's reader: the inverse of `generate_problem` on its closed vocabulary, lenient about the text between
    the operation phrases. None when no story is recognised."""
    start_re, phrase_re, phrase_op = _story_patterns()
    starts = list(start_re.finditer(text))
    if not starts:
        return None
    start = starts[-1]
    found = {k[:-1]: v for k, v in start.groupdict().items() if v is not None}
    name, value = found["name"], int(found["n"])
    pron = dict(_PEOPLE)[name]
    end = text.find("?", start.end())
    steps = []
    for k, m in enumerate(phrase_re.finditer(text, start.end(), end if end >= 0 else len(text))):
        phrase = m.group(0)
        b = re.search(r"\d+", phrase)
        op = phrase_op[(phrase[: b.start()], phrase[b.end():])]
        operand = int(b.group(0))
        new_value = _SYMBOL_TO_FN[op](value, operand)
        steps.append(f"Step {k + 1}: {name if k == 0 else _cap(pron)} {phrase}, so {value} {op} {operand} = {new_value}.")
        value = new_value
    if not steps:
        return None
    return "\n".join([*steps, f"\\boxed{{{value}}}"])


def _resolve_levels(level_names: Sequence[str] | str) -> list[MathLevel | StepLevel]:
    names = [level_names] if isinstance(level_names, str) else list(level_names)
    if not names:
        raise ValueError("level_names is empty")
    unknown = [n for n in names if n not in ALL_LEVELS]
    if unknown:
        raise ValueError(f"unknown level(s) {unknown}; valid: {list(ALL_LEVELS)}")
    return [ALL_LEVELS[n] for n in names]


def _level_stream(level: MathLevel | StepLevel, seed: int, split: str, n: int, exclude: frozenset[str],
                  recheck_share: float = 0.0) -> list[dict]:
    """First ``n`` unique prompts of one level's candidate stream.

    Candidate ``k`` uses its own RNG, and acceptance depends only on earlier
    candidates, so a stream of length n is a prefix of every longer stream:
    the eval set with n=500 is exactly the first 500 rows of the one with n=2000.
    A v2 level's prompts do not depend on ``recheck_share`` (v1 levels ignore it).
    """
    rows: list[dict] = []
    seen: set[str] = set()
    max_candidates = 50 * n + 1000
    k = 0
    while len(rows) < n:
        if k >= max_candidates:
            raise RuntimeError(
                f"level {level.name}: only {len(rows)} unique prompts after {k} candidates "
                f"(asked for {n}); the level's problem space is too small"
            )
        rng = random.Random(f"synthetic_math:{seed}:{split}:{level.name}:{k}")
        k += 1
        if isinstance(level, StepLevel):
            row = generate_v2_problem(rng, level, len(rows), split, recheck_share)
        else:
            row = generate_problem(rng, level, len(rows), split)
        if row["prompt"] in seen or row["prompt"] in exclude:
            continue
        seen.add(row["prompt"])
        rows.append(row)
    return rows


@functools.lru_cache(maxsize=64)
def _heldout_prompts(level_name: str, seed: int, reserve: int) -> frozenset[str]:
    """Prompts of the first ``reserve`` rows of every held-out split (cached)."""
    level = ALL_LEVELS[level_name]
    out: set[str] = set()
    for split in HELDOUT_SPLITS:
        out.update(r["prompt"] for r in _level_stream(level, seed, split, reserve, frozenset()))
    return frozenset(out)


def level_row_counts(n: int, weights: Sequence[float]) -> list[int]:
    """``n`` split over levels in proportion to ``weights`` by largest remainder (ties to the earlier level), so
    counts differ from the exact shares by less than one row; equal weights give ``n // L`` plus one for the
    first ``n % L`` levels."""
    if not weights or any(not (w > 0) or w == float("inf") for w in weights):
        raise ValueError(f"level weights must be positive and finite, got {list(weights)}")
    total = sum(weights)
    exact = [n * w / total for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda j: (-(exact[j] - counts[j]), j))
    for j in by_remainder[: n - sum(counts)]:
        counts[j] += 1
    return counts


def weighted_level_order(counts: Sequence[int]) -> list[int]:
    """The level index of each row: at every row the level furthest behind its share of the rows so far (ties to
    the earlier level). Why not blocks: a run that reads a prefix of the pool (SFT steps, RL steps) sees the
    mixture, not the first level. Equal counts give plain round-robin."""
    n = sum(counts)
    taken = [0] * len(counts)
    order: list[int] = []
    for i in range(n):
        j = max((k for k in range(len(counts)) if taken[k] < counts[k]),
                key=lambda k: ((i + 1) * counts[k] - taken[k] * n, -k))  # the deficit times n: exact ties
        taken[j] += 1
        order.append(j)
    return order


def generate_dataset(
    level_names: Sequence[str] | str,
    n: int,
    seed: int,
    split: str,
    *,
    heldout_reserve: int = DEFAULT_HELDOUT_RESERVE,
    recheck_share: float = DEFAULT_RECHECK_SHARE,
    level_weights: Sequence[float] | None = None,
) -> list[dict]:
    """``n`` rows interleaving ``level_names`` (round-robin unless ``level_weights``), deterministic in all args.

    Prompts are unique within a split. For any split that is not held out, the
    first ``heldout_reserve`` rows per level of every held-out split (same seed)
    are excluded, so train is disjoint from any eval/test set of up to that
    size; a held-out request larger than the reserve is refused for that reason.
    ``recheck_share``: the share of v2 rows (levels V2..V10) whose reference ends with a re-check tail
    (`slime_ext.tasks.v2.recheck`); v1 levels have none.
    ``level_weights``: rows per level in these proportions (`level_row_counts`), interleaved so every stretch of
    the pool holds the levels in about those proportions (`weighted_level_order`); None: equal shares, which
    gives the same rows as equal weights.
    """
    if not 0.0 <= recheck_share <= 1.0:
        raise ValueError(f"recheck_share must be in [0, 1], got {recheck_share}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not split or any(c in split for c in ":/\\ "):
        raise ValueError(f"bad split name {split!r}")
    levels = _resolve_levels(level_names)
    weights = [1.0] * len(levels) if level_weights is None else [float(w) for w in level_weights]
    per_level = level_row_counts(n, weights)
    heldout = split in HELDOUT_SPLITS
    if heldout and max(per_level) > heldout_reserve:
        raise ValueError(
            f"{split} split asks for {max(per_level)} rows of one level but heldout_reserve is "
            f"{heldout_reserve}; raise heldout_reserve (the same value must be used for train)"
        )
    streams = []
    for level, count in zip(levels, per_level):
        exclude = frozenset() if heldout else _heldout_prompts(level.name, seed, heldout_reserve)
        streams.append(_level_stream(level, seed, split, count, exclude, recheck_share))
    taken = [0] * len(levels)
    rows: list[dict] = []
    for j in weighted_level_order(per_level):
        rows.append(streams[j][taken[j]])
        taken[j] += 1
    if len(levels) > 1:
        # The same level listed twice would otherwise repeat prompts.
        seen: set[str] = set()
        for r in rows:
            if r["prompt"] in seen:
                raise ValueError(f"duplicate level in {list(level_names)} yields repeated prompts")
            seen.add(r["prompt"])
    return rows


def write_jsonl(rows: Iterable[dict], path: str | os.PathLike[str]) -> Path:
    """Write rows as JSON lines atomically (tmp file in the same dir, then os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: ``python -m slime_ext.tasks.synthetic_math --level L2 --n 1000 --seed 0 --split train --out P``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--level", nargs="+", default=[DEFAULT_LEVEL], choices=list(ALL_LEVELS),
                   help="one or more levels, interleaved round-robin")
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="train")
    p.add_argument("--heldout-reserve", type=int, default=DEFAULT_HELDOUT_RESERVE)
    p.add_argument("--recheck-share", type=float, default=DEFAULT_RECHECK_SHARE,
                   help="share of v2 rows (V2..V10) with a re-check tail")
    p.add_argument("--level-weights", type=float, nargs="+", default=None,
                   help="rows per level in these proportions, one weight per --level (default: equal)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.level_weights is not None and len(args.level_weights) != len(args.level):
        p.error(f"--level-weights has {len(args.level_weights)} values for {len(args.level)} levels")
    rows = generate_dataset(args.level, args.n, args.seed, args.split, heldout_reserve=args.heldout_reserve,
                            recheck_share=args.recheck_share, level_weights=args.level_weights)
    out = write_jsonl(rows, args.out)
    print(f"wrote {len(rows)} rows ({','.join(args.level)}, seed={args.seed}, split={args.split}) to {out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
