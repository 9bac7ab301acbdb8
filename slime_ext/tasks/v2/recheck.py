r"""The re-check tail: a line after a v2 answer that checks it and boxes it again.

Why: a tail after the answer is what a marker-gated abort (DUET's gate: a closed ``\boxed{}`` seen, then
EOS forced) can cut. A share of the references carry one so that the warm-started model writes such tails and
a method has something to trim. The tail always starts, on its own line, with ``RECHECK_MARKER`` and ends
with the same ``\boxed{N}`` as the line above it, so the verifier (it reads the last box) scores the response
the same with the tail and without it.

Layout of a reference with a tail (steps, the answer, the tail)::

    Step 1: ...
    Step n: ... = N.
    \boxed{N}
    Check: <one of TAIL_TEMPLATES> \boxed{N}
"""

from __future__ import annotations

import random
import re
from typing import Optional, Sequence

__all__ = ["RECHECK_MARKER", "DEFAULT_RECHECK_SHARE", "TAIL_TEMPLATES", "render_tail", "split_tail"]

RECHECK_MARKER = "Check:"
DEFAULT_RECHECK_SHARE = 0.25
_INVERSE = {"+": "-", "-": "+", "*": "/", "/": "*"}
# Fields: the last step a {op} b = c, its inverse c {inv} b = a, the step before it a0 {op0} b0 = a; {boxed}
# the answer's box. Three kinds: repeat the last step, undo it, redo the last two.
TAIL_TEMPLATES: tuple[str, ...] = (
    "Check: the last step again, {a} {op} {b} = {c}. {boxed}",
    "Check: going back, {c} {inv} {b} = {a}, which matches. {boxed}",
    "Check: redoing the last two steps, {a0} {op0} {b0} = {a} and {a} {op} {b} = {c}. {boxed}",
)


def render_tail(rng: random.Random, steps: Sequence[tuple[int, str, int, int]]) -> str:
    """A tail for a solution whose steps are ``(a, op, b, c)`` (at least two), template drawn from `rng`."""
    if len(steps) < 2:
        raise ValueError("a re-check tail needs at least two steps")
    (a0, op0, b0, _), (a, op, b, c) = steps[-2], steps[-1]
    template = TAIL_TEMPLATES[rng.randrange(len(TAIL_TEMPLATES))]
    return template.format(a=a, op=op, b=b, c=c, inv=_INVERSE[op], a0=a0, op0=op0, b0=b0,
                           boxed=f"\\boxed{{{c}}}")


def split_tail(solution: str) -> tuple[str, Optional[str]]:
    """(the solution up to its answer, the tail from its marker on, or None) of a v2 reference. Any run of
    newlines may precede the marker (``data.synthetic.step_separator`` turns "\n" into "\n\n")."""
    found = re.search(r"\n+" + re.escape(RECHECK_MARKER), solution)
    if found is None:
        return solution, None
    return solution[:found.start()], solution[found.start():].lstrip("\n")
