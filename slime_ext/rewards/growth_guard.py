r"""Static growth guard: refuses answers whose value would be astronomically large, without sympy.

Why: sympy evaluates integer arithmetic eagerly. ``10^(10^10)``, ``(10^6)!``, ``(100!)!`` or
``\binom{10^9}{5\cdot 10^8}`` each keep the worker inside one big-integer operation until it is
killed, and every kill costs a worker restart. The worker's time limit bounds the damage; this guard
turns the obvious cases into an immediate ``too_complex`` that names the form, at parse cost.

How: a small recursive-descent parser reads the validated expression string that ``latex_to_sympy``
produces (digits, letters, ``+ - * / ** ! ( ) [ ] ,``, implicit products) and carries, for every
sub-expression, an upper bound on the number of decimal digits of the integers sympy would compute.
The bounds are deliberately coarse (``a*b`` has at most digits(a) + digits(b) digits, ``a**b`` at most
digits(a) * |b|), so the guard may refuse a few huge-but-cheap values; it never needs sympy to decide.

Rules (reason strings in quotes start with the rule):

* no number, written or computed, with more than ``MAX_DIGITS`` digits: "a number with about N digits";
* a power's exponent may have at most ``MAX_EXPONENT_DIGITS`` digits; a non-numeric base (``x``,
  ``x+1``, a matrix with a variable) takes an exponent of at most ``MAX_SYMBOLIC_EXPONENT``;
  towers are at most ``MAX_TOWER_HEIGHT`` high;
* a factorial's argument is a literal integer of at most ``MAX_FACTORIAL_ARG`` (``5!``, ``(5)!``) or an
  expression with a variable whose numbers stay below that bound (``(n-1)!``, ``(2n)!``); a numeric
  expression (``(3+2)!``, ``(10^6)!``) and a factorial of a factorial (``(100!)!``, ``n!!``) are refused;
* ``binomial``/``\binom`` arguments stay below ``MAX_BINOMIAL_ARG`` (``MAX_FACTORIAL_ARG`` when an
  argument has a variable) and contain no factorial or binomial;
* brackets nest at most ``MAX_NESTING`` deep (beyond ``PYTHON_MAX_NESTING`` sympy cannot parse it anyway).

An expression the parser cannot read is passed on (``None``): sympy will most likely refuse it as well,
and the worker's time limit still bounds it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

__all__ = ["MAX_BINOMIAL_ARG", "MAX_DIGITS", "MAX_FACTORIAL_ARG", "growth_problem"]

MAX_DIGITS = 10_000
"""Largest number of decimal digits any written or computed integer may have (1000! has 2568)."""
MAX_EXPONENT_DIGITS = 15
"""An exponent above 10^15 makes any base other than 0 and +-1 astronomically large."""
MAX_SYMBOLIC_EXPONENT = 10**6
"""``x^{10^6}`` is kept; ``(x+1)^{10^{10}}`` would make simplification expand forever."""
MAX_TOWER_HEIGHT = 2
"""``a^{b^{c}}`` has height 2; anything taller is refused."""
MAX_FACTORIAL_ARG = 1000
MAX_BINOMIAL_ARG = 10**5
MAX_NESTING = 100
"""Bracket depth the guard reads; ``latex_to_sympy`` already caps macro nesting at 60. Deeper input is
refused, except beyond ``PYTHON_MAX_NESTING``, which sympy's parser (Python's) refuses by itself."""
PYTHON_MAX_NESTING = 200

_FUNCTIONS = frozenset({"sin", "cos", "tan", "sec", "csc", "cot", "asin", "acos", "atan", "sinh", "cosh",
                        "tanh", "log", "exp", "sqrt", "factorial", "binomial", "Matrix"})
_TOKEN_RE = re.compile(r"\s*(?:(\d+\.\d*|\.\d+|\d+)|([A-Za-z_][A-Za-z0-9_]*)|(\*\*|[-+*/!()\[\],]))")
_LOG10_2 = math.log10(2)


class _Rejected(Exception):
    """The expression grows too fast; the message is the reason reported to the caller."""


class _Unreadable(Exception):
    """The guard's parser cannot read the expression; sympy and the time limit decide."""


@dataclass(frozen=True)
class _Size:
    """What the guard knows about one sub-expression.

    ``digits``: upper bound on log10 of the largest integer sympy would hold for it (numerator or
    denominator; for a symbolic expression, its numeric coefficients). ``literal``: the exact value of
    a plain integer literal, possibly in parentheses, else None. ``symbolic``: contains a variable,
    a constant or an unevaluated function. ``combinatorial``: contains a factorial or a binomial.
    ``height``: power-tower height. ``items``: entries, for a matrix's size.
    """

    digits: float = 0.0
    literal: int | None = None
    symbolic: bool = False
    combinatorial: bool = False
    height: int = 0
    items: int = 1


def _combine(a: _Size, b: _Size, digits: float) -> _Size:
    """A binary operation's result: no longer a literal, flags of both sides."""
    return _Size(digits=digits, symbolic=a.symbolic or b.symbolic, combinatorial=a.combinatorial or b.combinatorial,
                 height=max(a.height, b.height), items=max(a.items, b.items))


def _checked(size: _Size) -> _Size:
    if size.digits > MAX_DIGITS:
        raise _Rejected(f"a number with about {size.digits:.3g} digits (more than {MAX_DIGITS})")
    return size


def _number(text: str) -> _Size:
    """A written number; a decimal counts all its digits (it is the fraction digits/10^k)."""
    if "." in text:
        return _checked(_Size(digits=float(len(text) - 1)))
    stripped = text.lstrip("0") or "0"
    if len(stripped) > 300:  # math.log10 would do, but a bound needs no big-int conversion
        return _checked(_Size(digits=float(len(stripped))))
    value = int(stripped)
    return _Size(digits=math.log10(value) if value > 1 else 0.0, literal=value)


def _power(base: _Size, exponent: _Size) -> _Size:
    height = max(base.height, 1 + exponent.height)
    if height > MAX_TOWER_HEIGHT:
        raise _Rejected(f"a power tower taller than {MAX_TOWER_HEIGHT}")
    result = replace(_combine(base, exponent, base.digits), height=height)
    if exponent.symbolic:
        return _checked(result)  # 2^n: sympy cannot evaluate it
    if exponent.digits > MAX_EXPONENT_DIGITS:
        raise _Rejected(f"a power whose exponent has about {exponent.digits:.3g} digits "
                        f"(more than {MAX_EXPONENT_DIGITS})")
    bound = 10.0**exponent.digits
    if base.symbolic and bound > MAX_SYMBOLIC_EXPONENT:
        raise _Rejected(f"an exponent of about {bound:.3g} on a non-numeric base (more than {MAX_SYMBOLIC_EXPONENT})")
    return _checked(replace(result, digits=base.digits * bound))


def _factorial(arg: _Size) -> _Size:
    if arg.combinatorial:
        raise _Rejected("a nested factorial (a factorial or binomial inside a factorial, or n!!)")
    if arg.literal is not None:
        if abs(arg.literal) > MAX_FACTORIAL_ARG:
            raise _Rejected(f"a factorial argument above {MAX_FACTORIAL_ARG}")
        digits = math.lgamma(abs(arg.literal) + 1) / math.log(10)
        return _checked(_Size(digits=digits, combinatorial=True))
    if not arg.symbolic:
        raise _Rejected(f"a factorial of an expression (only literal integers up to {MAX_FACTORIAL_ARG}, "
                        "or expressions with a variable, are read)")
    if arg.digits > math.log10(MAX_FACTORIAL_ARG):
        raise _Rejected(f"a factorial argument with numbers above {MAX_FACTORIAL_ARG}")
    return replace(arg, combinatorial=True, literal=None)


def _binomial(n: _Size, k: _Size) -> _Size:
    if n.combinatorial or k.combinatorial:
        raise _Rejected("a binomial argument containing a factorial or binomial")
    if max(n.digits, k.digits) > math.log10(MAX_BINOMIAL_ARG):
        raise _Rejected(f"a binomial argument above {MAX_BINOMIAL_ARG}")
    result = replace(_combine(n, k, max(n.digits, k.digits)), combinatorial=True)
    if result.symbolic:  # binomial(n, 10^5) would make simplification expand a product of 10^5 factors
        if result.digits > math.log10(MAX_FACTORIAL_ARG):
            raise _Rejected(f"a binomial argument with a variable and numbers above {MAX_FACTORIAL_ARG}")
        return result
    # C(n, k) <= 2^n and C(n, k) <= n^k
    digits = min(10.0**n.digits * _LOG10_2, 10.0**k.digits * n.digits)
    return _checked(replace(result, digits=digits))


def _call(name: str, args: list[_Size]) -> _Size:
    """A call of an allow-listed function; wrong arities are left to sympy."""
    if name == "factorial" and len(args) == 1:
        return _factorial(args[0])
    if name == "binomial" and len(args) == 2:
        return _binomial(*args)
    if name == "Matrix" and len(args) == 1:
        entries = args[0]
        return _checked(replace(entries, digits=entries.digits + math.log10(max(entries.items, 2)), literal=None))
    if len(args) != 1 or name in ("factorial", "binomial", "Matrix"):
        raise _Unreadable(f"{name} with {len(args)} arguments")
    arg = args[0]
    if name == "sqrt":
        return replace(arg, literal=None)
    return replace(arg, literal=None, symbolic=True)  # sympy leaves sin(3), log(5), exp(2) unevaluated


class _Parser:
    """Recursive descent over sympy's grammar for the validated strings: Python precedence,
    right-associative ``**``, postfix ``!``, and implicit products (``2x``, ``x(x+1)``, ``sin x``)."""

    def __init__(self, expr: str) -> None:
        self.tokens = self._tokenize(expr)
        self.pos = 0

    @staticmethod
    def _tokenize(expr: str) -> list[tuple[str, str]]:
        tokens: list[tuple[str, str]] = []
        pos, n = 0, len(expr)
        while pos < n:
            m = _TOKEN_RE.match(expr, pos)
            if m is None:
                if expr[pos:].strip() == "":
                    break
                raise _Unreadable(f"unexpected {expr[pos]!r}")
            kind = "num" if m.group(1) else "name" if m.group(2) else "op"
            tokens.append((kind, m.group(m.lastindex or 0)))
            pos = m.end()
        return tokens

    def _peek(self) -> tuple[str, str]:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ("end", "")

    def _take(self, op: str) -> bool:
        if self._peek() == ("op", op):
            self.pos += 1
            return True
        return False

    def _expect(self, op: str) -> None:
        if not self._take(op):
            raise _Unreadable(f"expected {op!r}")

    def parse(self) -> _Size:
        size = self._sequence(")")
        if self.pos != len(self.tokens):
            raise _Unreadable("trailing tokens")
        return size

    def _sequence(self, closer: str) -> _Size:
        """Comma-separated expressions (a tuple, a list, call arguments) merged into one size."""
        size = self._sum()
        count = 1
        while self._take(","):
            if self._peek() == ("op", closer):
                break
            other = self._sum()
            size = replace(_combine(size, other, max(size.digits, other.digits)), items=size.items + other.items)
            count += 1
        return size if count == 1 else replace(size, literal=None)

    def _sum(self) -> _Size:
        size = self._product()
        while self._peek() in (("op", "+"), ("op", "-")):
            self.pos += 1
            other = self._product()
            size = _checked(_combine(size, other, max(size.digits, other.digits) + _LOG10_2))
        return size

    def _starts_operand(self) -> bool:
        kind, text = self._peek()
        return kind in ("num", "name") or (kind == "op" and text in ("(", "["))

    def _product(self) -> _Size:
        size = self._signed()
        while True:
            if self._take("*") or self._take("/"):
                other = self._signed()
            elif self._starts_operand():  # implicit product
                other = self._signed()
            else:
                return size
            size = _checked(_combine(size, other, size.digits + other.digits))

    def _signed(self) -> _Size:
        if self._take("-") or self._take("+"):
            size = self._signed()
            return replace(size, literal=None if size.literal is None else -size.literal)
        return self._power()

    def _power(self) -> _Size:
        base = self._postfix(self._primary())
        if self._take("**"):
            return _power(base, self._signed())
        return base

    def _postfix(self, size: _Size) -> _Size:
        while self._take("!"):
            size = _factorial(size)
        return size

    def _primary(self) -> _Size:
        kind, text = self._peek()
        if kind == "num":
            self.pos += 1
            return _number(text)
        if kind == "name":
            self.pos += 1
            return self._name(text)
        if self._take("("):
            inner = self._nested(")")
            return inner
        if self._take("["):
            return replace(self._nested("]"), literal=None)
        raise _Unreadable(f"unexpected {text or 'end'}")

    def _nested(self, closer: str) -> _Size:
        size = self._sequence(closer)
        self._expect(closer)
        return size

    def _name(self, name: str) -> _Size:
        if name not in _FUNCTIONS:
            return _Size(symbolic=True)  # a variable or a constant (pi, e, i, oo)
        exponent = self._signed() if self._take("**") else None  # sin**2(x) is sin(x)**2
        if self._take("("):
            args = self._arguments()
        else:
            args = [self._signed()]  # implicit application: sin x
        size = _call(name, args)
        return size if exponent is None else _power(size, exponent)

    def _arguments(self) -> list[_Size]:
        args: list[_Size] = []
        if not self._take(")"):
            args.append(self._sum())
            while self._take(","):
                args.append(self._sum())
            self._expect(")")
        return args


def _bracket_depth(expr: str) -> int:
    """Deepest bracket nesting, in one pass (the parser would otherwise recurse that deep)."""
    depth = deepest = 0
    for ch in expr:
        if ch in "([":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]":
            depth -= 1
    return deepest


def growth_problem(expr: str) -> str | None:
    """Why ``expr`` (a validated ``latex_to_sympy`` string) is refused before sympy, or None.

    The reason is a short English phrase ("a nested factorial ...", "a number with about 1e+10
    digits ..."); ``compare_math`` reports it as ``too_complex`` with the phrase as detail.
    """
    if "!!" in expr.replace(" ", ""):
        return "a nested factorial (a factorial or binomial inside a factorial, or n!!)"
    depth = _bracket_depth(expr)
    if depth > PYTHON_MAX_NESTING:
        return None  # Python's parser, and so sympy, refuses it: parse_error
    if depth > MAX_NESTING:
        return f"brackets nested deeper than {MAX_NESTING}"
    try:
        _Parser(expr).parse()
    except _Rejected as exc:
        return str(exc)
    except RecursionError:
        return f"brackets nested deeper than {MAX_NESTING}"
    except _Unreadable:
        return None
    return None
