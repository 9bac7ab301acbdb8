"""The static growth guard: cheap, sympy-free rejection of answers whose value would be astronomically large."""

from __future__ import annotations

import time

import pytest

from slime_ext.rewards.growth_guard import growth_problem
from slime_ext.rewards.latex_to_sympy import is_power_bomb, latex_to_sympy
from slime_ext.rewards.normalize import normalize_answer


def _problem(latex: str) -> str | None:
    return growth_problem(latex_to_sympy(normalize_answer(latex)))


@pytest.mark.parametrize(
    ("latex", "why"),
    [
        ("(100!)!", "nested factorial"),
        ("((5)!)!", "nested factorial"),
        ("n!!", "nested factorial"),
        ("factorial(5!)", "nested factorial"),
        ("(10^6)!", "factorial of an expression"),
        ("(3+2)!", "factorial of an expression"),
        ("1001!", "factorial argument"),
        ("factorial(1000000)", "factorial argument"),
        ("(n+10^6)!", "factorial argument"),
        (r"\binom{10^9}{5\cdot 10^8}", "binomial argument"),
        ("binomial(10^9, 5*10^8)", "binomial argument"),
        (r"\binom{n}{10^9}", "binomial argument"),
        (r"\binom{100!}{3}", "binomial argument"),
        ("10^(10^10)", "digits"),
        ("10^{10^{10}}", "digits"),
        ("9^{9^9}", "digits"),
        ("2**2**100", "digits"),
        ("3^{123456789}", "digits"),
        ("(10^{5000})^{3}", "digits"),
        ("x^{10^{10}}", "exponent"),
        ("x^{x^{x^{x}}}", "tower"),
        (r"\begin{pmatrix}1&1\\1&0\end{pmatrix}^{10^6}", "digits"),
    ],
)
def test_growth_forms_are_rejected_with_a_reason(latex: str, why: str) -> None:
    problem = _problem(latex)
    assert problem is not None and why in problem, (latex, problem)
    assert is_power_bomb(latex_to_sympy(normalize_answer(latex)))


@pytest.mark.parametrize(
    "latex",
    ["5!", "(5)!", "1000!", "n!", "(n-1)!", "(2n)!", "n!/(n-1)!", r"\binom{10}{3}", r"\binom{n}{2}",
     r"\binom{2n}{n}", r"\binom{2020}{1010}", "2^{10}", "2^{2^{3}}", "10^{100}", "x^{1000}", r"e^{i\pi}",
     r"\sqrt{2}^{4}", "x^2+y^2+z^2", r"\frac{1}{2^{100}}", "-2^{-10}", "1^{10^{10}}", "0.5^{20}",
     r"\sin(x)^{2}", r"\begin{pmatrix}1&1\\1&0\end{pmatrix}^{10}", "2x(x+1)^{3}", r"\pi r^2", "x_1^{2}"],
)
def test_ordinary_answers_pass(latex: str) -> None:
    assert _problem(latex) is None, latex


def test_bracket_depth() -> None:
    def nested(depth: int) -> str:
        return "(" * depth + "2**2**100" + ")" * depth

    assert growth_problem(nested(90)) is not None and "digits" in growth_problem(nested(90))
    assert growth_problem(nested(150)) == "brackets nested deeper than 100"
    assert growth_problem(nested(400)) is None  # Python's parser refuses it: sympy says parse_error
    assert growth_problem("(" * 90 + "1" + ")" * 90) is None


def test_guard_is_fast_on_long_and_deep_input() -> None:
    hostile = ["(" * 400 + "1" + ")" * 400, "2**" * 300 + "2", "1+" * 450 + "1", "x" * 900, "!" * 900,
               "(" * 200 + "x" + ")!" * 200]
    start = time.monotonic()
    for expr in hostile:
        assert isinstance(growth_problem(expr), (str, type(None)))
    assert time.monotonic() - start < 0.5
