r"""Math answer verification: boxed extraction, then string, exact-numeric and symbolic comparison.

Cheapest first: most answers are decided by normalised string equality or exact rational
comparison, and only the rest pay for a round trip to the sympy worker process, which has a hard
timeout. Nothing here raises on model output; failures come back as a reason string.

Numeric rule: integers, decimals, ``a/b`` and ``\frac{a}{b}`` are compared exactly as
``fractions.Fraction``. The only tolerance is for a decimal against a fraction with no finite
decimal expansion: equal when the relative difference is strictly below 1e-6 (``0.3333333`` ==
``1/3``, but ``0.333333`` and ``0.33`` are not). Percent: ``50%`` equals ``50`` and ``0.5``.
Lists (top-level commas): tuples and intervals, ``(..)``/``[..]``, are compared item by item in
order, and bracket types must match when both sides have brackets (``(1,2)`` != ``[1,2]``); sets
``\{..\}`` and bare lists (``x = 2, 3``) are compared as multisets. A bare list matches either.

Limits: ``timeout_s`` bounds the whole call, extraction, guards, sympy and waiting for the worker
included; a call returns within ``timeout_s + TIME_LIMIT_MARGIN_S``. Answers and labels longer than
``MAX_ANSWER_CHARS`` and boxes before the scan window (``MAX_SCAN_CHARS``) are ``too_long``; values
that would grow astronomically (``growth_guard``) are ``too_complex``; both say why in ``detail``.
"""

from __future__ import annotations

import re
import time
from fractions import Fraction

from slime_ext.rewards import sympy_worker
from sglang_patches.boxed_answer import MAX_SCAN_CHARS, extract_last_boxed, find_last_boxed
from slime_ext.rewards.growth_guard import growth_problem
from slime_ext.rewards.latex_to_sympy import UnsupportedExpression, latex_to_sympy
from slime_ext.rewards.normalize import normalize_answer
from slime_ext.rewards.result import VerifyResult

__all__ = ["compare_math", "extract_last_boxed", "math_equal", "normalize_answer", "verify_math"]

MAX_ANSWER_CHARS = 1000
"""Longer answers and labels are rejected as "too_long" before any parsing: real answers are short."""
TIME_LIMIT_MARGIN_S = 0.25
"""A call returns within its ``timeout_s`` plus this: parent-side work after the last deadline check
and sending the kill signal to a worker that ran out of time (it is reaped in the background)."""
MAX_LIST_ITEMS = 32
MAX_EXTRACTED_CHARS = 1000
REL_TOL = Fraction(1, 10**6)

_INT_RE = re.compile(r"[+-]?\d+")
_DECIMAL_RE = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+)")
_SLASH_RE = re.compile(r"([+-]?\d+)/(\d+)")
_FRAC_RE = re.compile(r"([+-]?)\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}")
_MIXED_RE = re.compile(r"([+-]?)(\d+)\\frac\{(\d+)\}\{(\d+)\}")
"""``1\frac{1}{2}`` is the mixed number 3/2 when the fraction is proper; ``2\sqrt{3}`` stays a product."""

_VERDICTS = {
    sympy_worker.EQUAL: (True, "correct"),
    sympy_worker.NOT_EQUAL: (False, "wrong"),
    sympy_worker.PARSE_ERROR: (False, "parse_error"),
    sympy_worker.TIMEOUT: (False, "timeout"),
    sympy_worker.TOO_COMPLEX: (False, "too_complex"),
    sympy_worker.WORKER_ERROR: (False, "worker_error"),
    sympy_worker.WORKER_BUSY: (False, "worker_busy"),
}


class _Deadline:
    """The end of a call's time limit, movable by the uncharged wait for the first sympy worker."""

    def __init__(self, timeout_s: float) -> None:
        self.at = time.monotonic() + timeout_s

    def remaining(self) -> float:
        return self.at - time.monotonic()


Outcome = tuple[bool, str, "str | None"]
"""(equivalent?, reason, detail): the detail says what a ``too_long``/``too_complex`` refused."""


def _parse_number(s: str) -> tuple[Fraction, bool] | None:
    """(value, written_as_decimal) for plain numbers, None for anything else."""
    try:
        if _INT_RE.fullmatch(s):
            return Fraction(int(s)), False
        if _DECIMAL_RE.fullmatch(s):
            return Fraction(s), True
        m = _SLASH_RE.fullmatch(s)
        if m:
            return Fraction(int(m.group(1)), int(m.group(2))), False
        m = _MIXED_RE.fullmatch(s)
        if m and int(m.group(3)) < int(m.group(4)):
            value = int(m.group(2)) + Fraction(int(m.group(3)), int(m.group(4)))
            return (-value if m.group(1) == "-" else value), False
        m = _FRAC_RE.fullmatch(s)
        if m:
            value = Fraction(int(m.group(2)), int(m.group(3)))
            return (-value if m.group(1) == "-" else value), False
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _has_finite_decimal(x: Fraction) -> bool:
    d = x.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


def _numbers_equal(a: tuple[Fraction, bool], b: tuple[Fraction, bool]) -> bool:
    (va, a_dec), (vb, b_dec) = a, b
    if va == vb:
        return True
    if a_dec == b_dec:
        return False
    exact = vb if a_dec else va
    if _has_finite_decimal(exact):
        return False  # e.g. 0.7 vs 3/4: a finite decimal must match exactly
    return abs(va - vb) < REL_TOL * max(abs(va), abs(vb))


def _percent_readings(value: tuple[Fraction, bool], had_percent: bool) -> list[tuple[Fraction, bool]]:
    return [value, (value[0] / 100, value[1])] if had_percent else [value]


def _outer_brackets(s: str) -> tuple[str, str]:
    """(bracket pair, inner) when one bracket pair spans all of ``s``; ("", s) otherwise."""
    if s.startswith("\\{") and s.endswith("\\}") and len(s) >= 4:
        return "{}", s[2:-2]
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]":
        depth = 0
        for i, c in enumerate(s):
            depth += (c in "([{") - (c in ")]}")
            if depth == 0 and i < len(s) - 1:
                return "", s  # e.g. (x+1)(x-1)
        return s[0] + s[-1], s[1:-1]
    return "", s


def _split_top_level(s: str) -> list[str]:
    parts: list[str] = []
    depth, start = 0, 0
    for i, c in enumerate(s):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    parts.append(s[start:])
    return parts


def _compare_scalar(pred: str, label: str, pred_pct: bool, label_pct: bool, deadline: _Deadline) -> Outcome:
    if pred == label:
        return True, "correct", None
    if not pred:
        return False, "empty_answer", None
    p_num, l_num = _parse_number(pred), _parse_number(label)
    if p_num is not None and l_num is not None:
        equal = any(
            _numbers_equal(a, b)
            for a in _percent_readings(p_num, pred_pct)
            for b in _percent_readings(l_num, label_pct)
        )
        return (True, "correct", None) if equal else (False, "wrong", None)
    try:
        p_expr = latex_to_sympy(pred)
    except UnsupportedExpression:
        return False, "parse_error", None
    try:
        l_expr = latex_to_sympy(label)
    except UnsupportedExpression:
        return False, "wrong", None  # a non-math label (e.g. a word) that did not match as a string
    for side, expr in (("answer", p_expr), ("label", l_expr)):
        problem = growth_problem(expr)
        if problem is not None:
            return False, "too_complex", f"{side}: {problem}"
    worker = sympy_worker.get_worker()
    deadline.at += worker.wait_for_first_start()  # a cold start is not charged (see sympy_worker)
    remaining = deadline.remaining()
    if remaining <= 0:
        return False, "timeout", None
    verdict = worker.compare(p_expr, l_expr, remaining)
    equal, reason = _VERDICTS.get(verdict, (False, "worker_error"))
    return equal, reason, None


def _length_problem(pred: str, label: str) -> Outcome | None:
    """``too_long`` for an answer or label past ``MAX_ANSWER_CHARS``, checked before any parsing."""
    for side, text in (("label", label), ("answer", pred)):
        if len(text) > MAX_ANSWER_CHARS:
            return False, "too_long", f"{side} has {len(text)} characters (at most {MAX_ANSWER_CHARS} are read)"
    return None


def compare_math(pred: str, label: str, timeout_s: float = 2.0) -> tuple[bool, str]:
    """(equivalent?, reason). ``timeout_s`` bounds the whole comparison (see ``TIME_LIMIT_MARGIN_S``).

    reason: "correct", "wrong", "empty_answer", "bad_label", "too_long", "too_complex",
    "parse_error", "timeout", "worker_busy" or "worker_error".
    """
    equal, reason, _ = _compare(pred, label, _Deadline(timeout_s))
    return equal, reason


def _compare(pred: str, label: str, deadline: _Deadline) -> Outcome:
    pred = "" if pred is None else str(pred)
    label = "" if label is None else str(label)
    too_long = _length_problem(pred, label)
    if too_long is not None:
        return too_long
    p, lab = normalize_answer(pred), normalize_answer(label)
    if not lab:
        return False, "bad_label", "the label is empty after normalisation"
    if not p:
        return False, "empty_answer", None
    if p == lab:
        return True, "correct", None
    p_brackets, p_inner = _outer_brackets(p)
    l_brackets, l_inner = _outer_brackets(lab)
    p_items, l_items = _split_top_level(p_inner), _split_top_level(l_inner)
    if len(p_items) == 1 and len(l_items) == 1:
        return _compare_scalar(p, lab, "%" in pred, "%" in label, deadline)
    if len(p_items) != len(l_items) or len(p_items) > MAX_LIST_ITEMS:
        return False, "wrong", None
    if p_brackets and l_brackets and p_brackets != l_brackets:
        return False, "wrong", None
    if (p_brackets or l_brackets) in ("()", "[]", "(]", "[)"):
        for a, b in zip(p_items, l_items):  # tuples and intervals: order matters
            outcome = _compare_scalar(a, b, False, False, deadline)
            if not outcome[0]:
                return outcome
        return True, "correct", None
    return _match_unordered(p_items, l_items, deadline)


_FAILURE_PRIORITY = ("timeout", "worker_busy", "too_complex", "worker_error", "parse_error")


def _match_unordered(p_items: list[str], l_items: list[str], deadline: _Deadline) -> Outcome:
    """Sets and bare lists (roots "2, 3" vs "3, 2"): every predicted item must match a distinct label item."""
    if sorted(p_items) == sorted(l_items):
        return True, "correct", None
    unmatched = list(l_items)
    failures: dict[str, str | None] = {}
    for a in p_items:
        for idx, b in enumerate(unmatched):
            equal, reason, detail = _compare_scalar(a, b, False, False, deadline)
            if equal:
                del unmatched[idx]
                break
            failures.setdefault(reason, detail)
        else:
            reason = next((r for r in _FAILURE_PRIORITY if r in failures), "wrong")
            return False, reason, failures.get(reason)
    return True, "correct", None


def math_equal(pred: str, label: str, timeout_s: float = 2.0) -> bool:
    """True when ``pred`` and ``label`` are the same mathematical answer (see module docstring)."""
    return compare_math(pred, label, timeout_s)[0]


def verify_math(response: str, label: object, timeout_s: float = 2.0) -> VerifyResult:
    r"""Scores the last ``\boxed{}`` answer of ``response`` against ``label`` (plain or boxed).

    ``timeout_s`` bounds the whole call; it returns within ``timeout_s + TIME_LIMIT_MARGIN_S``.
    """
    deadline = _Deadline(timeout_s)
    try:
        content, why = find_last_boxed(response if isinstance(response, str) else "")
        if content is None:
            return VerifyResult(0.0, why, detail=_extraction_detail("response", why))
        extracted = content[:MAX_EXTRACTED_CHARS]
        label_text = "" if label is None else str(label)
        if "\\boxed" in label_text or "\\fbox" in label_text:
            inner, why = find_last_boxed(label_text)
            if inner is None:
                reason = "too_long" if why == "too_long" else "bad_label"
                return VerifyResult(0.0, reason, extracted, detail=_extraction_detail("label", why))
            label_text = inner
        equal, reason, detail = _compare(content, label_text, deadline)
        return VerifyResult(1.0 if equal else 0.0, reason, extracted, detail=detail)
    except Exception as exc:  # last line of defence: a verifier bug must not kill the run
        return VerifyResult(0.0, "verifier_error", None, detail=f"{type(exc).__name__}: {exc}"[:300])


def _extraction_detail(side: str, why: str) -> str | None:
    """Says where the box was when it could not be read (``too_long``); other reasons speak for themselves."""
    if why == "too_long":
        return f"{side}: the last \\boxed starts before the last {MAX_SCAN_CHARS} characters, the part that is read"
    if why == "unbalanced_braces" and side == "label":
        return "label: its last \\boxed is not closed"
    return None
