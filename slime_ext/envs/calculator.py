"""The `calculator` tool: arithmetic on numbers, evaluated without running the model's text as Python.

The input is parsed with Python's `ast` (parsing only, nothing is executed) and the tree is walked here,
accepting only numbers, `+ - * / // % **` (`^` is read as `**`), unary signs, brackets, the constants
`pi` and `e` and the functions in FUNCTIONS. Names, attributes, subscripts, calls of anything else, strings
and comprehensions are refused with a message. Values are sympy numbers: integers and fractions stay exact,
anything irrational becomes a 30-digit float. Every operation is checked before it runs against bounds on
the size of its result (MAX_DIGITS decimal digits, exponents up to MAX_EXPONENT), so `10**10**10` or
`9**9**9` is refused at once instead of filling memory; the tool's time limit bounds the rest.
"""

from __future__ import annotations

import ast
import math
from typing import Any, Callable

from slime_ext.envs.toolbox import Tool, ToolError

MAX_INPUT_CHARS = 1000
MAX_DIGITS = 4000  # no exact value with more digits (Python prints ints up to 4300), no float above 10**MAX_DIGITS
MAX_EXPONENT = 10**6  # |exponent| of a power whose base is not 0, 1 or -1
MAX_TRIG_ARG = 1e15
PRECISION = 30  # digits of an irrational value
SHOWN_DIGITS = 15  # significant digits of a non-integer result


def _sympy() -> Any:
    import sympy

    return sympy


def _digits(value: Any) -> float:
    """Decimal digits of the largest integer an exact value holds, or of a float's magnitude."""
    sp = _sympy()
    if value.is_Rational:
        return max(abs(int(value.p)).bit_length(), abs(int(value.q)).bit_length()) * math.log10(2)
    if value.is_Float:
        return max(float(sp.log(abs(value), 10)), 0.0) if value != 0 else 0.0
    return 0.0


def _checked(value: Any) -> Any:
    sp = _sympy()
    if value.has(sp.zoo, sp.oo, -sp.oo, sp.nan):
        raise ToolError("the result is undefined (division by zero?)")
    if not value.is_number:
        raise ToolError("the result is not a number")
    if not (value.is_Rational or value.is_Float):  # sqrt(2), pi, exp(1), a complex number ...
        value = sp.N(value, PRECISION)
        if value.has(sp.I):
            raise ToolError("the result is not a real number")
    if _digits(value) > MAX_DIGITS:
        raise ToolError(f"the result has more than {MAX_DIGITS} digits")
    return value


def _log10_abs(x: Any) -> float:
    sp = _sympy()
    return float(sp.log(abs(x), 10).evalf(20)) if x != 0 else -math.inf


def _power(base: Any, exponent: Any) -> Any:
    if base in (0, 1, -1) and exponent.is_Integer:
        return _checked(base**exponent)
    if abs(exponent) > MAX_EXPONENT:
        raise ToolError(f"the exponent {exponent} is too large (at most {MAX_EXPONENT})")
    if base == 0 and exponent < 0:
        raise ToolError("division by zero (0 to a negative power)")
    size = abs(float(exponent)) * abs(_log10_abs(base)) if base != 0 else 0.0
    if size > MAX_DIGITS:
        raise ToolError(f"the result would have about {size:.3g} digits (at most {MAX_DIGITS})")
    if base.is_Rational and exponent.is_Rational and not exponent.is_Integer:
        size = _digits(base) * abs(float(exponent))  # an exact root of a large fraction
        if size > MAX_DIGITS:
            raise ToolError(f"the result would have about {size:.3g} digits (at most {MAX_DIGITS})")
    return _checked(base**exponent)


def _exp(x: Any) -> Any:
    if x > MAX_DIGITS * math.log(10):
        raise ToolError(f"exp({x}) is too large")
    return _checked(_sympy().exp(x))


def _log(x: Any, base: Any = None) -> Any:
    sp = _sympy()
    if x <= 0 or (base is not None and (base <= 0 or base == 1)):
        raise ToolError("log needs a positive argument (and a positive base other than 1)")
    return _checked(sp.log(x) if base is None else sp.log(x) / sp.log(base))


def _sqrt(x: Any) -> Any:
    if x < 0:
        raise ToolError("sqrt of a negative number")
    return _checked(_sympy().sqrt(x))


def _trig(name: str) -> Callable[[Any], Any]:
    def fn(x: Any) -> Any:
        if abs(x) > MAX_TRIG_ARG:
            raise ToolError(f"{name} of a number above {MAX_TRIG_ARG:g}")
        return _checked(getattr(_sympy(), name)(x))
    return fn


FUNCTIONS: dict[str, tuple[Callable[..., Any], tuple[int, ...]]] = {  # name -> (function, allowed arg counts)
    "sqrt": (_sqrt, (1,)), "abs": (lambda x: _checked(abs(x)), (1,)), "exp": (_exp, (1,)), "log": (_log, (1, 2)),
    "ln": (_log, (1,)), "sin": (_trig("sin"), (1,)), "cos": (_trig("cos"), (1,)), "tan": (_trig("tan"), (1,)),
    "floor": (lambda x: _checked(_sympy().floor(x)), (1,)), "ceil": (lambda x: _checked(_sympy().ceiling(x)), (1,)),
    "round": (lambda x: _checked(_sympy().Integer(round(float(x))) if abs(x) < 1e15 else x), (1,)),
}


def _binary(op: ast.operator, a: Any, b: Any) -> Any:
    if isinstance(op, ast.Pow):
        return _power(a, b)
    if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)) and b == 0:
        raise ToolError("division by zero")
    if isinstance(op, ast.Mult) and _digits(a) + _digits(b) > MAX_DIGITS + 1:
        raise ToolError(f"the result has more than {MAX_DIGITS} digits")
    ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b, ast.Div: lambda: a / b,
           ast.FloorDiv: lambda: _sympy().floor(a / b), ast.Mod: lambda: a % b}
    fn = ops.get(type(op))
    if fn is None:
        raise ToolError(f"the operator {type(op).__name__} is not supported (use + - * / // % ** or ^)")
    return _checked(fn())


def _number(value: Any) -> Any:
    sp = _sympy()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ToolError(f"{value!r} is not a number")
    if isinstance(value, int):
        return _checked(sp.Integer(value))
    if not math.isfinite(value):
        raise ToolError("the number is too large")
    return _checked(sp.Float(repr(value), PRECISION))


def _eval(node: ast.AST) -> Any:
    sp = _sympy()
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        return _number(node.value)
    if isinstance(node, ast.BinOp):
        return _binary(node.op, _eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _eval(node.operand)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.Name):
        constants = {"pi": sp.pi, "e": sp.E}
        if node.id in constants:
            return _checked(constants[node.id])
        raise ToolError(f"unknown name {node.id!r} (constants: pi, e; functions: {', '.join(FUNCTIONS)})")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS:
        fn, arities = FUNCTIONS[node.func.id]
        if node.keywords or len(node.args) not in arities:
            raise ToolError(f"{node.func.id} takes {' or '.join(map(str, arities))} argument(s)")
        return fn(*[_eval(a) for a in node.args])
    raise ToolError(f"{type(node).__name__} is not allowed: only numbers, + - * / // % ** ^, brackets, pi, e and "
                    f"the functions {', '.join(FUNCTIONS)}")


def format_number(value: Any) -> str:
    """An integer exactly; anything else with SHOWN_DIGITS significant digits."""
    if value.is_Integer:
        return str(int(value))
    import mpmath

    return mpmath.nstr(mpmath.mpf(_sympy().Float(value, PRECISION)._mpf_), SHOWN_DIGITS)


def calculate(expression: str) -> str:
    """The value of an arithmetic expression as text; ToolError for anything else."""
    text = expression.strip()
    if not text:
        raise ToolError("no expression was given")
    if len(text) > MAX_INPUT_CHARS:
        raise ToolError(f"the expression is longer than {MAX_INPUT_CHARS} characters")
    try:
        tree = ast.parse(text.replace("^", "**"), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ToolError(f"cannot parse the expression: {type(exc).__name__}: {exc}") from None
    try:
        return format_number(_eval(tree))
    except RecursionError:
        raise ToolError("the expression is nested too deeply") from None
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise ToolError(f"cannot evaluate the expression: {type(exc).__name__}: {exc}") from None


class CalculatorTool(Tool):
    name = "calculator"

    def run(self, arg: str) -> str:
        return calculate(arg)
