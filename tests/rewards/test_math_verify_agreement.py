"""Our math verdicts against ``math-verify`` (the PyPI package, a test-only reference) on a table.

Every disagreement must be listed in INTENDED_DISAGREEMENTS with the reason our convention differs
(see docs/rewards.md); an unlisted disagreement, or a listed one that no longer disagrees, fails.
"""

from __future__ import annotations

import pytest

from slime_ext.rewards import math_equal
from tests.rewards.test_verifiers import EQUIVALENT, NOT_EQUIVALENT

math_verify = pytest.importorskip("math_verify", reason="math-verify (test extra) is not installed")

NEW_FORMS = [
    # matrices, binomials, factorials, mixed numbers (issue 15, item 6)
    (r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", True),
    (r"\begin{bmatrix}1&2\\3&4\end{bmatrix}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", True),
    (r"\begin{pmatrix}\frac{1}{2}\\x\end{pmatrix}", r"\begin{pmatrix}0.5\\x\end{pmatrix}", True),
    (r"\begin{pmatrix}1&2\\3&5\end{pmatrix}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", False),
    (r"\begin{pmatrix}1&2\end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}", False),
    (r"\binom{5}{2}", "10", True),
    (r"\dbinom{6}{3}", "20", True),
    (r"\tbinom{n}{1}", "n", True),
    (r"\binom{5}{2}", "11", False),
    ("5!", "120", True),
    ("3!+1", "7", True),
    ("n!/(n-1)!", "n", True),
    ("5!", "24", False),
    (r"1\frac{1}{2}", r"\frac{3}{2}", True),
    (r"1\frac{1}{2}", "1.5", True),
    (r"-2\frac{1}{3}", r"-\frac{7}{3}", True),
    (r"3\frac{1}{4}", r"\frac{3}{4}", False),
    (r"2\sqrt{3}", r"\sqrt{12}", True),
    (r"2\pi", r"\pi+\pi", True),
    (r"2\sqrt{3}", r"2+\sqrt{3}", False),
]
TABLE = [(label, pred, expected) for pred, label, expected in EQUIVALENT + NOT_EQUIVALENT + NEW_FORMS]
"""(gold, prediction, our intended verdict)."""

# (gold, prediction) -> why our verdict differs from math-verify's on purpose.
INTENDED_DISAGREEMENTS: dict[tuple[str, str], str] = {
    ("0.5", r"x=\frac{1}{2}."): "we drop a trailing sentence period after the answer; math-verify fails to parse it",
    ("1,2,2", "1,1,2"): "bare lists are multisets for us (multiplicities count); math-verify compares them as sets",
    ("1/3", "0.333333"): "our decimal-vs-fraction tolerance is relative < 1e-6, strictly; math-verify rounds more loosely",
    ("1000", r"1\,000"): r"we read \, between digit groups as a thousands separator",
    ("1000000", "1 000 000"): "we read spaces between valid 3-digit groups as thousands separators",
    (r"2\pi", "2 pi"): "we read the bare word pi as the constant; math-verify reads it as the symbols p*i",
    ("5", "5 m"): "we never drop single-letter units (m could be a variable); math-verify drops them",
    ("n", "n!/(n-1)!"): "we simplify factorial ratios symbolically; math-verify does not",
}


# math-verify's comparison timeout: its 5 s default is spent in full on each power tower of the table (it gives up,
# False, as with any timeout); every other pair takes under 0.15 s on a loaded 2-core machine
REFERENCE_TIMEOUT_S = 2


def reference_verdict(gold: str, pred: str) -> bool:
    """math-verify's verdict; both sides are given as LaTeX in $..$, as its parser expects."""
    try:
        return bool(math_verify.verify(math_verify.parse(f"${gold}$"), math_verify.parse(f"${pred}$"),
                                       timeout_seconds=REFERENCE_TIMEOUT_S))
    except Exception:
        return False


def test_table_has_at_least_100_pairs() -> None:
    assert len(TABLE) >= 100


@pytest.mark.timeout(300)
def test_agreement_with_math_verify() -> None:
    ours = {(g, p): math_equal(p, g) for g, p, _ in TABLE}
    assert ours == {(g, p): expected for g, p, expected in TABLE}, "our own table expectations"
    theirs = {(g, p): reference_verdict(g, p) for g, p, _ in TABLE}
    disagreements = {key for key in ours if ours[key] != theirs[key]}
    unlisted = sorted(disagreements - set(INTENDED_DISAGREEMENTS))
    stale = sorted(set(INTENDED_DISAGREEMENTS) - disagreements)
    lines = [f"{g!r} vs {p!r}: ours={ours[(g, p)]} math-verify={theirs[(g, p)]}" for g, p in unlisted]
    assert not unlisted, "unlisted disagreements:\n" + "\n".join(lines)
    assert not stale, f"listed but no longer disagreeing: {stale}"
    print(f"math-verify agreement: {len(TABLE)} pairs, {len(TABLE) - len(disagreements)} agree, "
          f"{len(disagreements)} intended disagreements")


def test_library_code_does_not_import_math_verify() -> None:
    from pathlib import Path

    rewards = Path(__file__).resolve().parents[2] / "slime_ext" / "rewards"
    assert not [p.name for p in rewards.glob("*.py") if "math_verify" in p.read_text(encoding="utf-8")]
