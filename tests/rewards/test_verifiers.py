"""Math and multiple-choice verifiers: equivalence table, extraction, hostile input, worker lifecycle."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from slime_ext.rewards import (
    ReasonCounter,
    VerifyResult,
    available_verifiers,
    compare_math,
    extract_last_boxed,
    get_verifier,
    math_equal,
    normalize_answer,
    verify_choice,
    verify_math,
)
from sglang_patches.boxed_answer import find_last_boxed
from slime_ext.rewards.latex_to_sympy import UnsupportedExpression, is_power_bomb, latex_to_sympy
from slime_ext.rewards.sympy_worker import get_worker

# (pred, label, equivalent?) -- the documented equivalence rules, one row per rule or trap.
EQUIVALENT = [
    # fractions and decimals
    (r"\frac{3}{4}", "0.75", True),
    ("3/4", r"\frac{3}{4}", True),
    (r"\frac34", "0.75", True),
    (r"\dfrac{3}{4}", "3/4", True),
    (r"\tfrac{1}{2}", "0.5", True),
    ("0.5", r"\frac{1}{2}", True),
    ("0.750", "3/4", True),
    (".5", "0.5", True),
    ("4/2", "2", True),
    (r"\frac{6}{4}", r"\frac{3}{2}", True),
    (r"\frac{1}{3}", "0.3333333", True),  # relative difference 1e-7 < 1e-6
    # nested braces, roots, pi
    (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", True),
    (r"\sqrt2", r"\sqrt{2}", True),
    (r"2\sqrt{2}", r"\sqrt{8}", True),
    (r"\sqrt[3]{8}", "2", True),
    (r"2\pi", r"\pi\cdot 2", True),
    (r"\frac{\pi}{2}", r"\pi/2", True),
    (r"\pi r^2", r"r^2\pi", True),
    ("2 pi", r"2\pi", True),
    # thousands separators and spacing
    ("1,000", "1000", True),
    ("1{,}000", "1000", True),
    (r"1\,000", "1000", True),
    ("1 000 000", "1000000", True),
    ("12,345.5", "12345.5", True),
    # units, currency, degrees
    (r"5\text{ cm}", "5", True),
    (r"5 \text{cm}^2", "5", True),
    ("12 apples", "12", True),
    (r"12\text{ apples}", "12", True),
    (r"\$12.50", "12.5", True),
    (r"30^\circ", "30", True),
    # percent: 50% equals both 50 and 0.5
    (r"50\%", "50", True),
    ("50%", "0.5", True),
    ("0.5", r"50\%", True),
    ("1", "100%", True),
    # signs
    ("-3", "-3.0", True),
    (r"-\frac{1}{2}", "-0.5", True),
    (r"\frac{-1}{2}", r"-\frac{1}{2}", True),
    # symbolic
    ("2x+1", "1+2x", True),
    ("(x+1)^2", "x^2+2x+1", True),
    ("x^2-1", "(x-1)(x+1)", True),
    (r"\sin^2 x + \cos^2 x", "1", True),
    ("0.5x", r"\frac{x}{2}", True),
    ("10^{3}", "1000", True),
    ("x_1+x_2", "x_2+x_1", True),
    # wrappers: assignments, delimiters, boxed labels, trailing period
    ("x = 5", "5", True),
    ("y = 2x + 3", "2x+3", True),
    (r"x=\frac{1}{2}.", "0.5", True),
    (r"$\frac{1}{2}$", "1/2", True),
    ("7", r"\boxed{7}", True),
    # tuples, intervals, sets, lists
    (r"\left( 1, 2 \right)", "(1,2)", True),
    (r"\{1,2\}", r"\{2,1\}", True),
    ("2, 3", "3,2", True),
]

NOT_EQUIVALENT = [
    # close in string form
    ("12", "21", False),
    ("1/2", "2/1", False),
    (r"\frac{1}{2}", r"\frac{2}{1}", False),
    ("-3", "3", False),
    ("0.5", "5", False),
    # decimal near misses
    ("0.333333", "1/3", False),  # relative difference exactly 1e-6: not strictly below
    ("0.33", r"\frac{1}{3}", False),
    (r"\frac{2}{3}", "0.67", False),
    ("0.7", r"\frac{3}{4}", False),
    ("0.1", r"\frac{1}{9}", False),
    ("1000000.5", "1000000", False),  # no tolerance against integers
    ("3.14", r"\pi", False),
    (r"\sqrt{2}", "1.41", False),
    # spacing and separators that are not thousands groupings
    ("1 2", "12", False),
    ("1,2", "12", False),
    ("1,000", "1", False),
    # units that must not be dropped, percent not misread
    ("5 m", "5", False),  # single-letter units are kept: they look like variables
    ("12 apples", "13", False),
    ("50%", "5", False),
    ("x = 5", "6", False),
    # symbolic
    ("2x+1", "2x-1", False),
    ("(x+1)^2", "x^2+1", False),
    ("x^2", "x^3", False),
    ("x+y", "xy", False),
    ("-x", "x", False),
    ("x", "y", False),
    (r"2\pi", "2", False),
    (r"\sqrt{2}", "2", False),
    (r"\infty", r"-\infty", False),
    (r"\frac{1}{0}", "1", False),
    (r"\text{yes}", r"\text{no}", False),
    # tuples and intervals keep order and bracket type
    ("(1,2)", "[1,2]", False),
    ("(1,2)", "(2,1)", False),
    ("(1,2]", "(1,2)", False),
    ("1,1,2", "1,2,2", False),
    # empty
    ("", "5", False),
    ("   ", "0", False),
    ("5", "", False),
    # hostile: towers, code injection
    ("2^{2^{2^{30}}}", "1", False),
    ("9^{9^{9^{9}}}", "1", False),
    ("10^{10^{10^{10}}}", "1", False),
    ("9^9^9^9", "1", False),
    ("__import__('os').system('true')", "0", False),
    (r"\operatorname{exec}(1)", "1", False),
]

TABLE = EQUIVALENT + NOT_EQUIVALENT


def test_table_is_large_and_balanced() -> None:
    assert len(TABLE) >= 70
    assert abs(len(EQUIVALENT) - len(NOT_EQUIVALENT)) <= 10


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("pred", "label", "expected"), TABLE)
def test_math_equal_table(pred: str, label: str, expected: bool) -> None:
    assert math_equal(pred, label) is expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("pred", "label", "expected"), EQUIVALENT[:12] + NOT_EQUIVALENT[:12])
def test_math_equal_is_symmetric(pred: str, label: str, expected: bool) -> None:
    assert math_equal(label, pred) is expected


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        (r"\boxed{\dfrac{1}{2}}", r"\frac{1}{2}"),
        (r"\frac12", r"\frac{1}{2}"),
        (r"\frac1{2}", r"\frac{1}{2}"),
        (r"\sqrt2", r"\sqrt{2}"),
        (r"\left(1, 2\right)", "(1,2)"),
        (r"5\text{ cm}", "5"),
        (r"\text{(A)}", "(A)"),
        ("12 apples", "12"),
        ("2 pi", "2pi"),  # a math word is not a unit
        (r"50\%", "50"),
        ("1,000", "1000"),
        ("1,000,5", "1,000,5"),  # not a valid grouping: stays a list
        ("1 2", "1,2"),
        ("x = 5", "5"),
        ("5.", "5"),
        ("+7", "7"),
        (r"2\pi r", r"2\pi r"),  # the space that ends a command is kept
        ("4\x002", "42"),
        (None, ""),
    ],
)
def test_normalize_answer(raw: str | None, normalized: str) -> None:
    assert normalize_answer(raw) == normalized


# ---------------------------------------------------------------- boxed extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{5}.", "5"),
        (r"\boxed{1} first, then \boxed{2}", "2"),
        (r"\fbox{x+1}", "x+1"),
        (r"\boxed{1} then \fbox{2}", "2"),
        (r"\fbox{2} then \boxed{1}", "1"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{\sqrt{2}}{2}"),
        (r"\boxed {3}", "3"),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),
        (r"\boxed{}", ""),
        (r"mention \boxed in prose, answer \boxed{4}", "4"),
        (r"\boxed{4} and a bare \boxed", "4"),
        ("no box here", None),
        (r"\boxedfoo{3}", None),
        (r"\boxed{", None),
        (r"\boxed{1} but finally \boxed{2", None),  # the last box is authoritative
        ("", None),
    ],
)
def test_extract_last_boxed(text: str, expected: str | None) -> None:
    assert extract_last_boxed(text) == expected


def test_find_last_boxed_reasons() -> None:
    assert find_last_boxed("plain text") == (None, "no_boxed")
    assert find_last_boxed(r"\boxed{\frac{1}{2}") == (None, "unbalanced_braces")
    assert find_last_boxed(r"\boxed{7}") == ("7", "ok")
    assert find_last_boxed(r"\boxed{7}" + "x" * 30_000) == (None, "too_long")  # the box is before the window
    assert find_last_boxed("x" * 30_000) == (None, "no_boxed")


def test_extract_scans_only_the_tail_of_long_output() -> None:
    assert extract_last_boxed("x" * 100_000 + r"\boxed{42}") == "42"
    assert extract_last_boxed(r"\boxed{42}" + "x" * 100_000) is None


@pytest.mark.timeout(30)
def test_extract_handles_deep_nesting_without_recursion() -> None:
    depth = 5000
    text = r"\boxed{" + "{" * depth + "1" + "}" * depth + "}"
    content = extract_last_boxed(text)
    assert content is not None and len(content) == 2 * depth + 1


# ---------------------------------------------------------------- verify_math


@pytest.mark.parametrize(
    ("response", "label", "score", "reason"),
    [
        (r"The answer is \boxed{\frac{1}{2}}.", "0.5", 1.0, "correct"),
        (r"The answer is \boxed{\frac{1}{2}}.", r"\boxed{\frac{1}{2}}", 1.0, "correct"),
        (r"\boxed{3} no wait \boxed{4}", "4", 1.0, "correct"),
        (r"\boxed{3} no wait \boxed{4}", "3", 0.0, "wrong"),
        ("The answer is 4.", "4", 0.0, "no_boxed"),
        (r"The answer is \boxed{4", "4", 0.0, "unbalanced_braces"),
        (r"\boxed{}", "4", 0.0, "empty_answer"),
        (r"\boxed{4}", r"\boxed{4", 0.0, "bad_label"),
        (r"\boxed{4}", "", 0.0, "bad_label"),
        (r"\boxed{x^{}}", "4", 0.0, "parse_error"),
        ("\x00" * 1000 + r"\boxed{5}", "5", 1.0, "correct"),
        (r"\boxed{" + "a" * 2000 + "}", "5", 0.0, "too_long"),
        (r"\boxed{5}", "5" * 2000, 0.0, "too_long"),  # the label is past MAX_ANSWER_CHARS
        (None, "5", 0.0, "no_boxed"),
    ],
)
def test_verify_math(response: str, label: str, score: float, reason: str) -> None:
    result = verify_math(response, label)
    assert isinstance(result, VerifyResult)
    assert (result.score, result.reason) == (score, reason)


def test_verify_math_records_extracted_answer() -> None:
    result = verify_math(r"so \boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}")
    assert result.score == 1.0
    assert result.extracted == r"\frac{\sqrt{2}}{2}"


# ---------------------------------------------------------------- hostile input

@pytest.mark.timeout(30)
@pytest.mark.parametrize("tower", ["2^{2^{2^{30}}}", "9^{9^{9^{9}}}", "10^{10^{10^{10}}}", "9^9^9^9"])
def test_power_towers_are_rejected_up_front(tower: str) -> None:
    assert is_power_bomb(latex_to_sympy(normalize_answer(tower)))
    result = verify_math(rf"\boxed{{{tower}}}", "1")
    assert (result.score, result.reason) == (0.0, "too_complex")


def test_power_guard_allows_ordinary_powers() -> None:
    for ok in ("x^2+y^2+z^2", "2^{10}", "2^{2^{3}}", "e^{i\\pi}"):
        assert not is_power_bomb(latex_to_sympy(ok)), ok
    assert is_power_bomb(latex_to_sympy("3^{123456789}"))


def _reaped_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.01)
    return False


@pytest.mark.timeout(30)
def test_timeout_kills_worker_and_next_call_restarts_it() -> None:
    worker = get_worker()
    assert math_equal("x+1", "1+x")  # make sure a worker is up
    old_pid = worker.pid
    starts = worker.starts
    equal, reason = compare_math("(x+1)^{1000}", "x^{1000}+1", timeout_s=1.0)  # passes the growth guard
    assert (equal, reason) == (False, "timeout")
    assert worker.pid is None  # the successor is starting in the background
    assert _reaped_within(old_pid, 10.0)  # killed, and reaped in the background: no zombie left behind
    assert math_equal("(x+1)^2", "x^2+2x+1", timeout_s=60.0)  # waits for the successor, within its limit
    assert worker.starts == starts + 1
    assert worker.pid is not None and worker.pid != old_pid


@pytest.mark.timeout(30)
def test_parallel_threads_get_right_answers() -> None:
    cases = [("2x+1", "1+2x", True), ("(x+1)^2", "x^2+1", False), (r"\sin^2 x+\cos^2 x", "1", True),
             (r"\sqrt{8}", r"2\sqrt{2}", True), ("x^2", "x^3", False), (r"\frac{\pi}{2}", r"\pi", False)]
    results: dict[tuple[int, int], bool] = {}

    def run(thread_id: int) -> None:
        for i, (pred, label, _) in enumerate(cases):
            results[(thread_id, i)] = math_equal(pred, label, timeout_s=10.0)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {(t, i): cases[i][2] for t in range(4) for i in range(len(cases))}


@pytest.mark.timeout(30)
def test_parse_expr_never_sees_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    attack = f"__import__('os').system('touch {marker}')"
    assert not math_equal(attack, "0")
    assert compare_math(attack, "0")[1] == "parse_error"
    with pytest.raises(UnsupportedExpression):
        latex_to_sympy("().__class__")
    with pytest.raises(UnsupportedExpression):
        latex_to_sympy("x.real")
    assert not marker.exists()


_RNG = random.Random(0)
_GARBAGE = "".join(_RNG.choice("abc{}\\^_$%0123456789 \n\x00boxed") for _ in range(100_000))


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("response", "reason"),
    [
        (_GARBAGE, "no_boxed"),
        (_GARBAGE + r"\boxed{" + "x" * 500 + "}", "wrong"),  # read as x*x*...*x, compared symbolically
        (r"\boxed{" + _GARBAGE[:900] + "}", "parse_error"),
        (r"\boxed{" * 20_000, "unbalanced_braces"),
        ("}" * 50_000 + r"\boxed{1" + "{" * 50_000, "too_long"),  # the box is outside the scanned tail
        ("}" * 50_000 + r"\boxed{1" + "{" * 5_000, "unbalanced_braces"),
        (r"\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}", "too_long"),  # 10k levels, longer than the tail
        (r"\boxed{" + "{" * 9_000 + "1" + "}" * 9_000 + "}", "too_long"),
        (r"\boxed{" + "(" * 400 + "1" + ")" * 400 + "}", "parse_error"),
        (r"\boxed{" + r"\frac{" * 100 + "}", "unbalanced_braces"),
        (r"\boxed{" + "^" * 900 + "}", "parse_error"),  # not a tower: the growth guard cannot read it, nor sympy
        ("\x00" * 100_000, "no_boxed"),
        ("\\boxed{1\x00\x00}" + "\x00" * 50, "correct"),  # null bytes are stripped
    ],
)
def test_garbage_and_malformed_responses(response: str, reason: str) -> None:
    result = verify_math(response, "1")
    assert result.reason == reason
    assert result.score == (1.0 if reason == "correct" else 0.0)


@pytest.mark.timeout(30)
def test_normalize_is_fast_on_pathological_strings() -> None:
    # Patterns that make a naive regex backtrack; each call must finish long before the timeout.
    pathological = [
        "1 " * 50_000 + "x",
        r"\frac" * 20_000,
        r"\text{" * 20_000,
        "5" + r"\text{a}" * 20_000,  # many trailing units
        r"\boxed{" * 20_000 + "1" + "}" * 20_000,  # many nested whole-answer boxes
        r"\(" * 20_000 + "1" + r"\)" * 20_000,
        "1," * 50_000,
        "{" * 100_000,
        "$" * 100_000,
    ]
    for s in pathological:
        assert isinstance(normalize_answer(s), str)
    assert normalize_answer(r"\boxed{\boxed{7}}") == "7"


# ---------------------------------------------------------------- ReasonCounter and registry


def test_reason_counter_counts_and_merges() -> None:
    counter = ReasonCounter()
    for r in [VerifyResult(1.0, "correct"), VerifyResult(0.0, "no_boxed"), VerifyResult(0.0, "no_boxed")]:
        counter.add(r)
    assert counter.as_dict() == {"correct": 1, "no_boxed": 2}
    other = ReasonCounter([VerifyResult(0.0, "timeout"), VerifyResult(0.0, "no_boxed")])
    assert counter.merge(other) is counter
    assert counter.as_dict() == {"correct": 1, "no_boxed": 3, "timeout": 1}
    assert counter.total() == 5 and counter["timeout"] == 1 and counter["missing"] == 0
    assert other.as_dict() == {"timeout": 1, "no_boxed": 1}  # merge leaves the argument alone


def test_registry() -> None:
    assert available_verifiers() == ["code", "math", "multiple_choice"]
    assert get_verifier("math")(r"\boxed{2}", "2").score == 1.0
    assert get_verifier("multiple_choice")("Answer: B", 1).score == 1.0
    with pytest.raises(KeyError):
        get_verifier("poetry")


# ---------------------------------------------------------------- multiple choice


@pytest.mark.parametrize(
    ("response", "label", "score", "reason", "extracted"),
    [
        ("The answer is (C).", "C", 1.0, "correct", "C"),
        ("Answer: B", 1, 1.0, "correct", "B"),
        (r"so \boxed{D}", "3", 1.0, "correct", "D"),
        (r"\boxed{\text{(B)}}", "B", 1.0, "correct", "B"),
        ("the answer is c", "C", 1.0, "correct", "C"),
        ("C", 2, 1.0, "correct", "C"),
        ("After checking each option I pick (A)", "A", 1.0, "correct", "A"),
        ("The answer is C because A is wrong", "C", 1.0, "correct", "C"),
        ("The answer is C. Option B is close", "C", 1.0, "correct", "C"),
        ("The answer is **B**", "(b)", 1.0, "correct", "B"),
        ("Answer: B", "C", 0.0, "wrong", "B"),
        (r"\boxed{A} hmm, actually \boxed{B}", "A", 0.0, "wrong", "B"),
        ("The answer is A or C", "A", 0.0, "ambiguous", None),
        (r"\boxed{A, C}", "C", 0.0, "ambiguous", None),
        ("Answer: B and D", "B", 0.0, "ambiguous", None),
        ("I don't know", "A", 0.0, "no_answer", None),
        (None, "A", 0.0, "no_answer", None),
    ],
)
def test_verify_choice(response: str, label: object, score: float, reason: str, extracted: str | None) -> None:
    result = verify_choice(response, label)
    assert (result.score, result.reason, result.extracted) == (score, reason, extracted)


@pytest.mark.parametrize("label", ["Z", 7, "7", -1, True, "hello", None, ""])
def test_verify_choice_bad_labels(label: object) -> None:
    assert verify_choice("Answer: A", label, num_choices=4).reason == "bad_label"


def test_verify_choice_letter_index_mapping_and_range() -> None:
    for index, letter in enumerate("ABCD"):
        assert verify_choice(f"Answer: {letter}", index, num_choices=4).score == 1.0
        assert verify_choice(f"Answer: {letter}", str(index), num_choices=4).score == 1.0
    assert verify_choice("Answer: E", "A", num_choices=4).reason == "invalid_choice"
