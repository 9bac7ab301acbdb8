"""Split assert-style tests so that expected values never enter the candidate's process.

Each top-level ``assert EXPR[, MSG]`` is cut into *holes* and a *skeleton*. A hole is a maximal
sub-expression that needs the candidate's namespace (a name, a call of a candidate function, a
subscript, an attribute ...); the candidate's process evaluates only the holes and sends their values
back as plain data. The skeleton -- literals, operators, comparisons and a few pure built-ins such as
``len``/``sorted``/``abs``/``math.isclose`` -- is evaluated here, in the verifier, by a small AST
interpreter (never ``eval``), on the decoded values. ``assert add(1, 2) == 3`` therefore sends
``add(1, 2)`` to the candidate and keeps ``== 3`` here.

Other top-level statements (imports, assignments, helper definitions) are *setup*: they run in the
candidate's namespace, in order, between the checks. An ``assert`` nested inside a ``def``, loop or
``if`` would have to execute inside the candidate, so such tests are refused (``UnsupportedTests``).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MAX_SEQUENCE_REPEAT = 10**6
MAX_POWER_EXPONENT = 10_000


class UnsupportedTests(ValueError):
    """The tests use a form whose expected side cannot be kept out of the candidate's process."""


class CheckError(ValueError):
    """A skeleton could not be evaluated on the candidate's values (counts as a failed check)."""


@dataclass(frozen=True)
class Check:
    """One assert: ``holes`` run in the candidate, ``skeleton`` (holes named ``__hole_i``) runs here."""

    index: int
    source: str
    message: str
    holes: tuple[str, ...]
    skeleton: ast.expr


@dataclass(frozen=True)
class TestPlan:
    steps: tuple[dict[str, Any], ...]
    """What the candidate runs after the program: ``{"exec": src}`` or ``{"id": n, "eval": [src, ...]}``."""
    checks: tuple[Check, ...]


_PURE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs, "len": len, "sorted": sorted, "set": set, "frozenset": frozenset, "list": list,
    "tuple": tuple, "dict": dict, "round": round, "min": min, "max": max, "sum": sum, "all": all,
    "any": any, "float": float, "int": int, "str": str, "bool": bool, "repr": repr,
}
_PURE_MATH: dict[str, Callable[..., Any]] = {"isclose": math.isclose, "sqrt": math.sqrt, "fabs": math.fabs}
_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_CMPOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_, ast.IsNot: operator.is_not,
}
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos,
}


def _pure_callee(func: ast.expr) -> Callable[..., Any] | None:
    if isinstance(func, ast.Name):
        return _PURE_FUNCTIONS.get(func.id)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "math":
        return _PURE_MATH.get(func.attr)
    return None


class _HoleCutter(ast.NodeTransformer):
    """Replaces every sub-expression that is not pure skeleton by ``__hole_i``."""

    def __init__(self) -> None:
        self.holes: list[str] = []

    def _hole(self, node: ast.expr) -> ast.Name:
        self.holes.append(ast.unparse(node))
        return ast.Name(id=f"__hole_{len(self.holes) - 1}", ctx=ast.Load())

    def visit(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Starred) or (isinstance(node, ast.Dict) and None in node.keys):
            raise UnsupportedTests("unpacking in an assert")
        if isinstance(node, ast.Constant):
            return node
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict, ast.BoolOp, ast.Compare)):
            return self.generic_visit(node)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return self.generic_visit(node)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return self.generic_visit(node)
        if isinstance(node, ast.Call) and _pure_callee(node.func) is not None:
            node.args = [self.visit(a) for a in node.args]
            for kw in node.keywords:
                kw.value = self.visit(kw.value)
            return node
        if isinstance(node, ast.expr_context | ast.boolop | ast.cmpop | ast.operator | ast.unaryop):
            return node
        return self._hole(node)  # type: ignore[arg-type]


def _contains_assert(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(node))


def plan_tests(tests: str | Sequence[str]) -> TestPlan:
    """Parses the tests into candidate steps and verifier-side checks; raises UnsupportedTests."""
    src = tests if isinstance(tests, str) else "\n".join(str(t) for t in tests)
    try:
        module = ast.parse(src)
    except SyntaxError as exc:
        raise UnsupportedTests(f"tests do not parse: {exc}") from exc
    steps: list[dict[str, Any]] = []
    checks: list[Check] = []
    for stmt in module.body:
        if not isinstance(stmt, ast.Assert):
            if _contains_assert(stmt):
                raise UnsupportedTests("assert inside a block; write each assert as a top-level statement")
            steps.append({"exec": ast.unparse(stmt)})
            continue
        cutter = _HoleCutter()
        skeleton = cutter.visit(ast.parse(ast.unparse(stmt.test), mode="eval").body)
        message = ""
        if stmt.msg is not None:
            message = str(stmt.msg.value) if isinstance(stmt.msg, ast.Constant) else ast.unparse(stmt.msg)
        check = Check(len(checks), f"assert {ast.unparse(stmt.test)}", message, tuple(cutter.holes), skeleton)
        checks.append(check)
        steps.append({"id": check.index, "eval": list(check.holes)})
    if not checks:
        raise UnsupportedTests("no assert statements")
    return TestPlan(tuple(steps), tuple(checks))


# ------------------------------------------------------------------ values from the candidate


def decode_value(data: Any) -> Any:
    """Plain data from the candidate's JSON encoding; raises CheckError on anything else."""
    if data is None or type(data) in (bool, int, str):
        return data
    if type(data) is not dict or len(data) != 1:
        raise CheckError("malformed value")
    (tag, payload), = data.items()
    try:
        if tag == "float":
            return float(payload)
        if tag == "complex":
            return complex(float(payload[0]), float(payload[1]))
        if tag == "bytes":
            return bytes.fromhex(payload)
        if tag in ("list", "tuple", "set", "frozenset"):
            items = [decode_value(v) for v in payload]
            return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
        if tag == "dict":
            return {decode_value(k): decode_value(v) for k, v in payload}
    except (TypeError, ValueError) as exc:  # unhashable set items, bad hex ...
        raise CheckError(f"malformed value: {exc}") from exc
    raise CheckError(f"unknown value tag {tag!r}")


# ------------------------------------------------------------------ the skeleton interpreter


def _guarded_binop(op: type, a: Any, b: Any) -> Any:
    if op is ast.Mult:
        for seq, n in ((a, b), (b, a)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_SEQUENCE_REPEAT:
                raise CheckError("repetition too large")
    if op is ast.Pow and isinstance(b, int) and abs(b) > MAX_POWER_EXPONENT:
        raise CheckError("exponent too large")
    return _BINOPS[op](a, b)


def _eval(node: ast.AST, values: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.Tuple):
        return tuple(_eval(e, values) for e in node.elts)
    if isinstance(node, ast.List):
        return [_eval(e, values) for e in node.elts]
    if isinstance(node, ast.Set):
        return {_eval(e, values) for e in node.elts}
    if isinstance(node, ast.Dict):
        return {_eval(k, values): _eval(v, values) for k, v in zip(node.keys, node.values) if k is not None}
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, values))
    if isinstance(node, ast.BinOp):
        return _guarded_binop(type(node.op), _eval(node.left, values), _eval(node.right, values))
    if isinstance(node, ast.BoolOp):
        result: Any = isinstance(node.op, ast.And)
        for v in node.values:
            result = _eval(v, values)
            if bool(result) != isinstance(node.op, ast.And):
                return result
        return result
    if isinstance(node, ast.Compare):
        left = _eval(node.left, values)
        for op, comparator in zip(node.ops, node.comparators):
            right = _eval(comparator, values)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call):
        func = _pure_callee(node.func)
        assert func is not None
        args = [_eval(a, values) for a in node.args]
        kwargs = {kw.arg: _eval(kw.value, values) for kw in node.keywords if kw.arg}
        return func(*args, **kwargs)
    raise CheckError(f"unsupported node {type(node).__name__}")


def check_passes(check: Check, encoded_values: list[Any]) -> tuple[bool, str]:
    """(passed?, why not) for one check, given the candidate's encoded hole values."""
    if not isinstance(encoded_values, list) or len(encoded_values) != len(check.holes):
        return False, "wrong number of values"
    try:
        values = {f"__hole_{i}": decode_value(v) for i, v in enumerate(encoded_values)}
        return bool(_eval(check.skeleton, values)), ""
    except CheckError as exc:
        return False, str(exc)
    except (ArithmeticError, TypeError, ValueError, KeyError, RecursionError, MemoryError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
