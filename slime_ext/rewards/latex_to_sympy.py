r"""Translate a normalised LaTeX-ish answer into a *validated* sympy expression string.

Why our own translator: sympy's ``parse_latex`` needs antlr4, which we do not install.
Why validation matters: ``sympy.parse_expr`` ends in ``eval``, so model output must never reach it
unchecked (``__import__('os')...``). The output alphabet is restricted to digits, operators,
parentheses, allow-listed function names and single-letter (optionally subscripted) symbols.

This module is pure Python and cheap; sympy itself only runs in the worker process.
"""

from __future__ import annotations

import re

from sglang_patches.boxed_answer import matching_brace
from slime_ext.rewards.growth_guard import growth_problem


class UnsupportedExpression(ValueError):
    """The answer uses notation we do not translate; it is compared as a string only."""


_FUNCTIONS = {
    "sin": "sin", "cos": "cos", "tan": "tan", "sec": "sec", "csc": "csc", "cot": "cot",
    "arcsin": "asin", "arccos": "acos", "arctan": "atan", "sinh": "sinh", "cosh": "cosh",
    "tanh": "tanh", "ln": "log", "log": "log", "exp": "exp",
}
_CONSTANTS = {"pi": "pi", "infty": "oo"}
_GREEK = {
    name: name
    for name in ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
                 "mu", "nu", "xi", "rho", "sigma", "tau", "phi", "chi", "psi", "omega", "varphi",
                 "vartheta", "varepsilon")
}
_GREEK["lambda"] = "lamda"  # "lambda" is a Python keyword

FUNCTION_NAMES = frozenset(_FUNCTIONS.values()) | {"sqrt", "binomial", "factorial", "Matrix"}
CONSTANT_NAMES = frozenset(_CONSTANTS.values())
SYMBOL_WORDS = frozenset(_GREEK.values())

_CMD_RE = re.compile(r"\\([A-Za-z]+|.)", re.DOTALL)
_ALLOWED_CHARS_RE = re.compile(r"^[0-9A-Za-z_+\-*/(). !\[\],]*$")
"""``!`` is the factorial (sympy's factorial_notation); ``[``, ``]`` and ``,`` only build Matrix rows."""
_NUMBER_RE = re.compile(r"\d+\.\d*|\.\d+|\d+")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SYMBOL_RE = re.compile(r"[A-Za-z](?:_[A-Za-z0-9]+)?")
_MAX_DEPTH = 60



def _read_argument(s: str, i: int) -> tuple[str, int]:
    """One macro argument starting at ``i``: a ``{group}``, a ``\\command`` or a single character."""
    n = len(s)
    while i < n and s[i] == " ":
        i += 1
    if i >= n:
        raise UnsupportedExpression("missing argument")
    if s[i] == "{":
        j = matching_brace(s, i)
        if j < 0:
            raise UnsupportedExpression("unbalanced braces")
        return s[i + 1 : j], j + 1
    if s[i] == "\\":
        m = _CMD_RE.match(s, i)
        assert m is not None
        return m.group(0), m.end()
    return s[i], i + 1


def _convert(s: str, depth: int) -> str:
    if depth > _MAX_DEPTH:
        raise UnsupportedExpression("nesting too deep")
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            m = _CMD_RE.match(s, i)
            assert m is not None
            name, i = m.group(1), m.end()
            if name == "frac":
                num, i = _read_argument(s, i)
                den, i = _read_argument(s, i)
                out.append(f"(({_convert(num, depth + 1)})/({_convert(den, depth + 1)}))")
            elif name == "sqrt":
                index = None
                while i < n and s[i] == " ":
                    i += 1
                if i < n and s[i] == "[":
                    j = s.find("]", i)
                    if j < 0:
                        raise UnsupportedExpression("unterminated root index")
                    index, i = s[i + 1 : j], j + 1
                arg, i = _read_argument(s, i)
                inner = _convert(arg, depth + 1)
                if index is None:
                    out.append(f"sqrt({inner})")
                else:
                    out.append(f"(({inner})**(1/({_convert(index, depth + 1)})))")
            elif name == "binom":
                n_arg, i = _read_argument(s, i)
                k_arg, i = _read_argument(s, i)
                out.append(f"binomial(({_convert(n_arg, depth + 1)}),({_convert(k_arg, depth + 1)}))")
            elif name == "matrix":  # normalize_answer rewrites matrix environments to \matrix{a&b;c&d}
                body, i = _read_argument(s, i)
                rows = [[_convert(cell, depth + 1) for cell in row.split("&")] for row in body.split(";")]
                if len({len(r) for r in rows}) != 1:
                    raise UnsupportedExpression("ragged matrix")
                out.append("Matrix([" + ",".join("[" + ",".join(f"({c})" for c in r) + "]" for r in rows) + "])")
            elif name in ("cdot", "times", "ast"):
                out.append("*")
            elif name == "div":
                out.append("/")
            elif name in _FUNCTIONS:
                out.append(f" {_FUNCTIONS[name]} ")
            elif name in _CONSTANTS:
                out.append(f" {_CONSTANTS[name]} ")
            elif name in _GREEK:
                out.append(f" {_GREEK[name]} ")
            elif name == " ":
                out.append(" ")
            else:
                raise UnsupportedExpression(f"unsupported command \\{name}")
            continue
        if c == "{":
            out.append("(")
        elif c == "}":
            out.append(")")
        elif c == "^":
            out.append("**")
        elif c == "_":
            sub, i = _read_argument(s, i + 1)
            if not sub.isalnum() or not sub.isascii():
                raise UnsupportedExpression("unsupported subscript")
            out.append("_" + sub)
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _split_multiletter(m: re.Match[str]) -> str:
    name = m.group(0)
    if name in FUNCTION_NAMES or name in CONSTANT_NAMES or name in SYMBOL_WORDS:
        return name
    if _SYMBOL_RE.fullmatch(name):
        return name
    if name.isalpha():  # implicit product of single-letter symbols: "xy" -> x*y
        return "*".join(name)
    raise UnsupportedExpression(f"unsupported identifier {name!r}")


def _validate(expr: str) -> str:
    if not expr.strip():
        raise UnsupportedExpression("empty expression")
    if not _ALLOWED_CHARS_RE.match(expr):
        raise UnsupportedExpression("unsupported character")
    if "." in _NUMBER_RE.sub("0", expr):
        raise UnsupportedExpression("'.' outside a number")  # blocks attribute access
    if "__" in expr:
        raise UnsupportedExpression("dunder")
    depth = 0
    for ch in expr:
        depth += (ch == "(") - (ch == ")")
        if depth < 0:
            raise UnsupportedExpression("unbalanced parentheses")
    if depth != 0:
        raise UnsupportedExpression("unbalanced parentheses")
    return _IDENT_RE.sub(_split_multiletter, expr)


def latex_to_sympy(s: str) -> str:
    """Sympy-parsable, validated expression string for a normalised answer.

    Raises UnsupportedExpression for anything outside the supported subset.
    """
    try:
        return _validate(_convert(s, 0))
    except RecursionError as exc:
        raise UnsupportedExpression("nesting too deep") from exc


def is_power_bomb(expr: str) -> bool:
    """True when the static growth guard refuses ``expr`` (see ``growth_guard.growth_problem`` for why)."""
    return growth_problem(expr) is not None
