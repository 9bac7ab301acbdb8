"""Equivalent phrasings of one v2 story sentence and one v2 solution step, per operation kind.

Why: v1 writes every step the same way, so a model's response length and pacing are fixed by the task. Here
each step draws one of five templates for its operation (three shared by all operations, two worded for it),
short ("Step 3: 45 - 12 = 33.") to long (the running total, the story's phrase and the equation), so the
size of each disclosure unit varies with the phrasing while its content does not.

Every step line starts ``Step k:`` and ends with its equation ``a op b = c.``: the code that reads steps
(SxS's triples, ``parse_step`` here) needs nothing else, and the verifier only reads the ``\\boxed{}`` answer.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Optional

from slime_ext.tasks.story_vocab import OBJECTS, OP_PHRASES, cap

__all__ = ["STORY_PHRASES", "STEP_TEMPLATES", "ParsedStep", "render_step", "parse_step", "apply_op"]

# Story verb phrases per operation ({b}: the operand). "+" and "-" are v1's; "*" adds one to v1's three;
# "/" is new: an exact division told as keeping one of b equal parts.
STORY_PHRASES: dict[str, tuple[str, ...]] = {
    "+": OP_PHRASES["+"],
    "-": OP_PHRASES["-"],
    "*": OP_PHRASES["*"] + ("gets {b} times as many as before",),
    "/": (
        "splits them into {b} equal piles and keeps one pile",
        "divides them into {b} equal bags and keeps one bag",
        "puts them in {b} equal rows and keeps one row",
        "keeps only one of {b} equal shares",
    ),
}

# Solution step templates. Fields: {k} step number, {Who} the name (step 1) or the capitalised pronoun, {pron}
# the pronoun, {phrase} the story's phrase for this step, {obj} the objects, {a} {op} {b} = {c} the equation.
_SHARED: tuple[str, ...] = (
    "Step {k}: {Who} {phrase}, so {a} {op} {b} = {c}.",
    "Step {k}: {a} {op} {b} = {c}.",
    "Step {k}: {Who} has {a} {obj} and {phrase}, so {pron} now has {a} {op} {b} = {c}.",
)
_WORDED: dict[str, tuple[str, ...]] = {
    "+": ("Step {k}: Adding {b} to {a} gives {a} + {b} = {c}.",
          "Step {k}: {b} more than {a} is {a} + {b} = {c}."),
    "-": ("Step {k}: Taking {b} away from {a} leaves {a} - {b} = {c}.",
          "Step {k}: {b} fewer than {a} is {a} - {b} = {c}."),
    "*": ("Step {k}: Multiplying {a} by {b} gives {a} * {b} = {c}.",
          "Step {k}: {b} times {a} is {a} * {b} = {c}."),
    "/": ("Step {k}: Dividing {a} by {b} gives {a} / {b} = {c}.",
          "Step {k}: One of {b} equal parts of {a} is {a} / {b} = {c}."),
}
STEP_TEMPLATES: dict[str, tuple[str, ...]] = {op: _SHARED + _WORDED[op] for op in STORY_PHRASES}


def apply_op(a: int, op: str, b: int) -> int:
    """``a op b`` for the v2 operations (``/`` is exact: the generator only divides by divisors)."""
    if op == "/":
        if b == 0 or a % b:
            raise ValueError(f"{a} / {b} is not exact")
        return a // b
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def render_step(template: str, *, k: int, who: str, pron: str, phrase: str, obj: str,
                a: int, op: str, b: int, c: int) -> str:
    """One solution line from a template of `STEP_TEMPLATES` (``Who`` is `who` with a capital)."""
    return template.format(k=k, Who=cap(who), pron=pron, phrase=phrase, obj=obj, a=a, op=op, b=b, c=c)


@dataclass(frozen=True)
class ParsedStep:
    """A solution line read back: which template of its operation (index into ``STEP_TEMPLATES[op]``), the
    step number and the equation."""

    template: int
    k: int
    a: int
    op: str
    b: int
    c: int


def _template_regex(template: str, op: str) -> re.Pattern:
    """A template as a regex: numbers and the phrase as groups (a repeated field must repeat its value)."""
    phrases = "|".join(re.escape(p).replace(r"\{b\}", r"\d+") for p in STORY_PHRASES[op])
    fields = {"k": r"\d+", "a": r"\d+", "b": r"\d+", "c": r"\d+", "Who": r"[A-Z][a-z]+", "pron": r"[a-z]+",
              "obj": "|".join(OBJECTS), "op": re.escape(op), "phrase": phrases}
    out, seen, pos = [], set(), 0
    for m in re.finditer(r"\{(\w+)\}", template):
        out.append(re.escape(template[pos:m.start()]))
        name = m.group(1)
        if name in seen:
            out.append(f"(?P={name})")
        elif name in ("op", "obj", "Who", "pron"):
            out.append(f"(?:{fields[name]})")
        else:
            out.append(f"(?P<{name}>{fields[name]})")
            seen.add(name)
        pos = m.end()
    out.append(re.escape(template[pos:]))
    return re.compile("".join(out))


@functools.lru_cache(maxsize=1)
def _step_regexes() -> tuple[tuple[str, int, re.Pattern], ...]:
    return tuple((op, i, _template_regex(t, op)) for op, ts in STEP_TEMPLATES.items() for i, t in enumerate(ts))


def parse_step(line: str) -> Optional[ParsedStep]:
    """The template and equation of one v2 solution line, or None when no template matches it whole.

    A phrase's operand must equal the equation's ``b``, so a line whose story phrase and equation disagree
    does not parse.
    """
    for op, i, regex in _step_regexes():
        m = regex.fullmatch(line)
        if m is None:
            continue
        phrase = m.groupdict().get("phrase")
        if phrase is None or re.search(r"\d+", phrase).group(0) == m.group("b"):
            return ParsedStep(i, int(m.group("k")), int(m.group("a")), op, int(m.group("b")), int(m.group("c")))
    return None
