"""The difficulty table of task family v2: one level per number of steps, V2 (easy) to V10 (out of reach).

Why a separate table from v1's `MathLevel`: v2 levels have an exact step count (a level *is* a length and
pacing setting, so pools mixing levels mix lengths in known proportions) and a fourth operation, exact
division, which v1's ops and feasibility rules do not know.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StepLevel", "V2_LEVELS", "OPS"]

OPS: tuple[str, ...] = ("+", "-", "*", "/")


@dataclass(frozen=True)
class StepLevel:
    """One v2 level.

    The story starts at a value in ``start_min..start_max``; ``+``/``-`` operands are in
    ``operand_min..operand_max``; ``*`` factors and ``/`` divisors in ``factor_min..factor_max`` (a divisor
    always divides the running value exactly). Every running value stays in ``1..max_value``.
    """

    name: str
    n_steps: int
    start_min: int
    start_max: int
    operand_min: int
    operand_max: int
    ops: tuple[str, ...]
    factor_min: int
    factor_max: int
    max_value: int

    def __post_init__(self) -> None:
        if self.name != f"V{self.n_steps}" or not 2 <= self.n_steps <= 10:
            raise ValueError(f"{self.name}: a v2 level is named V<steps>, 2 <= steps <= 10")
        if not 2 <= self.start_min <= self.start_max <= self.max_value:
            raise ValueError(f"{self.name}: need 2 <= start_min <= start_max <= max_value")
        if not 1 <= self.operand_min <= self.operand_max:
            raise ValueError(f"{self.name}: need 1 <= operand_min <= operand_max")
        if not 2 <= self.factor_min <= self.factor_max:
            raise ValueError(f"{self.name}: need 2 <= factor_min <= factor_max")
        if not set(self.ops) <= set(OPS) or not {"+", "-"} <= set(self.ops):
            raise ValueError(f"{self.name}: ops must contain + and - and be a subset of {OPS}")
        # Feasibility for the op choice: below the cap "+" fits, and whenever "+" would cross it "-" fits.
        if self.max_value < 2 * self.operand_max + 1:
            raise ValueError(f"{self.name}: max_value must be > 2 * operand_max")


# Ordered easy -> hard. Steps grow by one per level; numbers, factors and the cap grow every level or two, so
# the top levels (up to 5-digit running totals, factors and divisors up to 49 or 99, 9-10 steps) are far beyond
# the tiny model. Fields: name, steps, start min/max, +/- operand min/max, ops, factor min/max, cap. The sizes
# put the references of V8-V10 at about 200-400 tokens with the run's tokenizer (docs/tasks.md has the table).
V2_LEVELS: dict[str, StepLevel] = {
    lvl.name: lvl
    for lvl in (
        StepLevel("V2", 2, 2, 20, 1, 20, ("+", "-"), 2, 2, 99),
        StepLevel("V3", 3, 2, 49, 1, 49, ("+", "-"), 2, 2, 199),
        StepLevel("V4", 4, 2, 99, 1, 99, ("+", "-", "*"), 2, 5, 999),
        StepLevel("V5", 5, 10, 99, 1, 99, ("+", "-", "*", "/"), 2, 9, 999),
        StepLevel("V6", 6, 10, 199, 1, 199, ("+", "-", "*", "/"), 2, 9, 9_999),
        StepLevel("V7", 7, 100, 499, 1, 499, ("+", "-", "*", "/"), 2, 12, 9_999),
        StepLevel("V8", 8, 100, 999, 10, 999, ("+", "-", "*", "/"), 2, 19, 99_999),
        StepLevel("V9", 9, 100, 999, 10, 999, ("+", "-", "*", "/"), 2, 49, 99_999),
        StepLevel("V10", 10, 1000, 9999, 100, 999, ("+", "-", "*", "/"), 2, 99, 99_999),
    )
}
