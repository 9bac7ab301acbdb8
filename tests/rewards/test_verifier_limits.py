r"""Every hostile verifier input finishes within its time limit and says what happened (issue 28, items 2, 5).

The limit is the caller's whole call: the static growth guard, the sympy worker's time limit, a worker
restart after an earlier timeout and the wait for a worker another thread holds. Timings are taken
while a busy-loop subprocess keeps another core busy, the way a training step's other work would.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from slime_ext.rewards import compare_math, verify_math
from slime_ext.rewards.sympy_worker import get_worker

LIMIT_S = 2.0
MARGIN_S = 0.25
"""The documented margin (docs/rewards.md, ``TIME_LIMIT_MARGIN_S``): parent-side work and killing the worker."""

SLOW = ("(x+1)^{1000}", "x^{1000}+1")
"""Passes the growth guard (a symbolic base, a small exponent) yet keeps sympy busy for many seconds."""

HOSTILE = [
    # (response, label, reason): each from issue 28 or a sibling of one
    (r"\boxed{(100!)!}", "1", "too_complex"),
    (r"\boxed{((5)!)!}", "1", "too_complex"),
    (r"\boxed{n!!}", "1", "too_complex"),
    (r"\boxed{(10^6)!}", "1", "too_complex"),
    (r"\boxed{factorial(10^6)}", "1", "too_complex"),
    (r"\boxed{(2^{20})!}", "1", "too_complex"),
    (r"\boxed{10^(10^10)}", "1", "too_complex"),
    (r"\boxed{10^{10^{10}}}", "1", "too_complex"),
    (r"\boxed{9^{9^9}}", "1", "too_complex"),
    (r"\boxed{2**2**100}", "1", "too_complex"),
    (r"\boxed{x^{10^{10}}}", "1", "too_complex"),
    (r"\boxed{\binom{10^9}{5\cdot 10^8}}", "1", "too_complex"),
    (r"\boxed{\dbinom{10^9}{5\cdot 10^8}}", "1", "too_complex"),
    (r"\boxed{binomial(10^9, 5*10^8)}", "1", "too_complex"),
    (r"\boxed{\binom{n}{10^9}}", "1", "too_complex"),
    (r"\boxed{\begin{pmatrix}1&1\\1&0\end{pmatrix}^{10^6}}", "1", "too_complex"),
    (r"\boxed{1}", r"(100!)!", "too_complex"),  # a hostile label is guarded like a response
    (r"\boxed{C(10^9, 5\cdot 10^8)}", "1", "parse_error"),  # C is a symbol here, not a binomial
    # lengths: the answer or the box lies beyond what is read
    ("\\boxed{" + "1" * 10**6 + "}", "1" * 10**6, "too_long"),
    (r"\boxed{5}" + "x" * 30_000, "5", "too_long"),
    (r"\boxed{5}", "5" * 2000, "too_long"),
    (r"\boxed{5}", "\\boxed{" + "5" * 10**6 + "}", "too_long"),
]


@pytest.fixture
def busy_core() -> Iterator[None]:
    """A busy-loop process for the duration of one test, so the timings are taken on a loaded machine."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def _warm() -> None:
    """Starts the worker (or waits out a restart) outside the timed region."""
    assert get_worker().compare("x", "x", 120.0) == "equal"


def _wait_until(condition: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _timed(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    start = time.monotonic()
    result = fn(*args, **kwargs)
    return result, time.monotonic() - start


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("response", "label", "reason"), HOSTILE)
def test_hostile_input_finishes_within_its_limit_and_says_why(
    busy_core: None, response: str, label: str, reason: str
) -> None:
    _warm()
    result, elapsed = _timed(verify_math, response, label, timeout_s=LIMIT_S)
    assert elapsed < LIMIT_S + MARGIN_S, f"{elapsed:.2f} s for {response[:40]!r}"
    assert (result.score, result.reason) == (0.0, reason)
    if reason in ("too_complex", "too_long"):
        assert result.detail, "a rejection names what it rejected"


@pytest.mark.timeout(120)
def test_a_huge_answer_compared_with_itself_is_too_long(busy_core: None) -> None:
    huge = "1" * 10**6
    (equal, reason), elapsed = _timed(compare_math, huge, huge, timeout_s=LIMIT_S)
    assert (equal, reason) == (False, "too_long")
    assert elapsed < LIMIT_S + MARGIN_S


@pytest.mark.timeout(120)
def test_the_call_after_a_timeout_is_not_charged_for_the_restart(busy_core: None) -> None:
    worker = get_worker()
    _warm()
    starts = worker.starts
    (equal, reason), elapsed = _timed(compare_math, *SLOW, timeout_s=0.5)
    assert (equal, reason) == (False, "timeout")
    assert elapsed < 0.5 + MARGIN_S
    # straight after: the worker is being restarted; this call must not pay for that beyond its own limit
    (equal, reason), elapsed = _timed(compare_math, "(x+1)^2", "x^2+2x+1", timeout_s=0.3)
    assert elapsed < 0.3 + MARGIN_S, f"{elapsed:.2f} s"
    assert reason in ("correct", "worker_busy")
    assert compare_math("(x+1)^2", "x^2+2x+1", timeout_s=60.0) == (True, "correct")
    assert worker.starts == starts + 1


@pytest.mark.timeout(120)
def test_waiting_for_a_worker_another_thread_holds_counts_toward_the_limit(busy_core: None) -> None:
    _warm()
    slow = threading.Thread(target=compare_math, args=SLOW, kwargs={"timeout_s": 3.0})
    slow.start()
    try:
        _wait_until(get_worker()._lock.locked, 10.0)  # the slow comparison now holds the worker
        (equal, reason), elapsed = _timed(compare_math, "(x+1)^2", "x^2+2x+1", timeout_s=0.5)
        assert elapsed < 0.5 + MARGIN_S, f"{elapsed:.2f} s"
        assert (equal, reason) == (False, "worker_busy")
    finally:
        slow.join()
    _warm()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("pred", "label"),
    [
        ("5!", "120"),
        ("10!", "3628800"),
        ("(5)!", "120"),
        ("n!/(n-1)!", "n"),
        ("(2n)!/(2n-1)!", "2n"),
        (r"\binom{10}{3}", "120"),
        (r"\binom{n}{2}", "n(n-1)/2"),
        (r"\binom{20}{10}", "184756"),
        ("1000!/999!", "1000"),
        ("2^{2^{3}}", "256"),
        ("2^{10}", "1024"),
        ("10^{100}", "100^{50}"),
        ("x^{1000}", "(x^{10})^{100}"),
        (r"e^{i\pi}", "-1"),
        (r"\sqrt{2}^{4}", "4"),
    ],
)
def test_legitimate_growth_still_verifies(pred: str, label: str) -> None:
    _warm()
    assert compare_math(pred, label, timeout_s=30.0) == (True, "correct")
