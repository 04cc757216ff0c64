"""Rule conditions: a small expression language, checked against an allow-list, evaluated with simpleeval.

Conditions arrive in pull requests, so they are untrusted input. A condition is parsed once
(`parse_condition`) and refused unless every node is on the allow-list below: comparisons,
`and`/`or`/`not`, arithmetic, `x if c else y`, calls of a few named functions, names of
metrics, `metric.field`, subscripts and slices, and number literals of bounded size. No
strings, containers, comprehensions, lambdas, keywords or underscores in names, so there is
no way to reach an object's attributes or a module. Evaluation (`evaluate`) sees only plain
dicts, lists and numbers, looks `metric.field` up as a dict key (never `getattr`), caps powers,
and stops when a time budget runs out. Arithmetic is float arithmetic: overflow gives inf, an
undefined result (0 / 0, inf - inf) gives nan, and every comparison with nan is false, so values
read from training that are inf or nan never make a condition fail. A condition that indexes or
reduces (mean, min, max, std) a window that is too short, empty included, is false as a whole
until the data is there. `typecheck` proves, before training, that a condition gives true or false.
"""

from __future__ import annotations

import ast
import math
import operator
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from simpleeval import SimpleEval

MAX_LENGTH = 500
"""Characters in one condition."""
MAX_NODES = 200
"""Syntax nodes in one condition."""
MAX_LITERAL = 1e15
"""Largest number a condition may write."""
MAX_EXPONENT = 64
"""Largest exponent `**` accepts."""
MAX_NUMBER = 1e300
"""`factory check` refuses arithmetic on numbers of known size (literals, step, counts) that can grow beyond this."""
SCALARS = ("step", "steps")
"""Names every condition may read besides its metrics: the step just done and the planned steps."""


class ConditionError(ValueError):
    """A condition is malformed or unsafe; the message says what to change."""


class NotEnoughData(Exception):
    """A window is still too short for what the condition reads: the condition is false for now."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Condition:
    """A parsed, allow-listed condition."""

    text: str
    tree: ast.expr
    fields: frozenset[tuple[str, str]]
    """Every `metric.field` it reads."""
    names: frozenset[str]
    """Every bare name it reads (metrics and scalars)."""


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConditionError(f"{what} needs numbers, found {type(value).__name__}: index a window (x[-1]) or reduce it (mean(x))")
    return value


def _arithmetic(op: Callable[[Any, Any], Any], symbol: str) -> Callable[[Any, Any], Any]:
    def apply(a: Any, b: Any) -> Any:
        a, b = _number(a, f"'{symbol}'"), _number(b, f"'{symbol}'")
        if symbol == "**" and abs(b) > MAX_EXPONENT:
            raise ConditionError(f"'**' is limited to exponents of at most {MAX_EXPONENT}")
        a, b = float(a), float(b)  # float arithmetic: no unbounded integers, and overflow is inf, not an error
        try:
            result = op(a, b)
        except ZeroDivisionError:  # x / 0, x // 0, x % 0, 0 ** -n
            if symbol == "**":
                return math.inf
            return math.inf if a > 0 and symbol != "%" else -math.inf if a < 0 and symbol != "%" else math.nan
        except OverflowError:  # only '**' raises it on floats
            return -math.inf if a < 0 and b == int(b) and int(b) % 2 else math.inf
        return math.nan if isinstance(result, complex) else result

    return apply


def _comparison(op: Callable[[Any, Any], bool], symbol: str) -> Callable[[Any, Any], bool]:
    def apply(a: Any, b: Any) -> bool:
        return op(_number(a, f"'{symbol}'"), _number(b, f"'{symbol}'"))

    return apply


def _window(values: Any, name: str) -> Sequence[float]:
    if not isinstance(values, list):
        raise ConditionError(f"{name}() takes a window (a list field such as history.loss), found {type(values).__name__}")
    if not values:
        raise NotEnoughData(name)
    return values


def _mean(values: Any) -> float:
    window = _window(values, "mean")
    return sum(window) / len(window)


def _std(values: Any) -> float:
    window = _window(values, "std")
    mean = sum(window) / len(window)
    return math.sqrt(sum((v - mean) * (v - mean) for v in window) / len(window))  # '**' would raise on overflow; '*' gives inf


def _reduce(fn: Callable[[Sequence[float]], float], name: str) -> Callable[..., float]:
    def apply(*args: Any) -> float:
        if len(args) == 1:
            return fn(_window(args[0], name))
        return fn([_number(a, f"{name}()") for a in args])

    return apply


def _length(values: Any) -> int:
    if not isinstance(values, list):
        raise ConditionError(f"len() takes a window, found {type(values).__name__}")
    return len(values)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "len": _length,
    "min": _reduce(min, "min"),
    "max": _reduce(max, "max"),
    "sum": lambda values: sum(values) if isinstance(values, list) else _window(values, "sum"),
    "mean": _mean,
    "std": _std,
    "abs": lambda value: abs(_number(value, "abs()")),
    "isfinite": lambda value: math.isfinite(_number(value, "isfinite()")),
}
OPERATORS: dict[type, Callable[..., Any]] = {
    ast.Add: _arithmetic(operator.add, "+"),
    ast.Sub: _arithmetic(operator.sub, "-"),
    ast.Mult: _arithmetic(operator.mul, "*"),
    ast.Div: _arithmetic(operator.truediv, "/"),
    ast.FloorDiv: _arithmetic(operator.floordiv, "//"),
    ast.Mod: _arithmetic(operator.mod, "%"),
    ast.Pow: _arithmetic(operator.pow, "**"),
    ast.Eq: _comparison(operator.eq, "=="),
    ast.NotEq: _comparison(operator.ne, "!="),
    ast.Lt: _comparison(operator.lt, "<"),
    ast.LtE: _comparison(operator.le, "<="),
    ast.Gt: _comparison(operator.gt, ">"),
    ast.GtE: _comparison(operator.ge, ">="),
    ast.USub: lambda a: -_number(a, "'-'"),
    ast.UAdd: lambda a: +_number(a, "'+'"),
    ast.Not: operator.not_,
}
ALLOWED_NODES = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.BinOp, ast.Compare, ast.IfExp, ast.Call, ast.Name,
    ast.Attribute, ast.Subscript, ast.Slice, ast.Constant, ast.Load, *OPERATORS,
)


def parse_condition(text: Any, metrics: Mapping[str, Any]) -> Condition:
    """Parse and allow-list a condition over the named metrics; raise ConditionError saying what is not allowed."""
    if not isinstance(text, str) or not text.strip():
        raise ConditionError(f"a condition is an expression such as 'batch.loss > 3 * batch.mean_loss', found {text!r}")
    if len(text) > MAX_LENGTH:
        raise ConditionError(f"the condition is {len(text)} characters long; the limit is {MAX_LENGTH}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ConditionError(f"not a valid expression: {getattr(e, 'msg', None) or e}") from e
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        raise ConditionError(f"the condition has {len(nodes)} parts; the limit is {MAX_NODES}: split it into rules")
    fields, names = set(), set()
    for node in nodes:
        if not isinstance(node, ALLOWED_NODES):
            raise ConditionError(f"{_describe(node)} is not allowed in a condition; use comparisons, arithmetic, and/or/not, "
                                 f"metric fields and the functions {', '.join(FUNCTIONS)}")
        if isinstance(node, ast.Constant) and not _is_small_number(node.value):
            raise ConditionError(f"only numbers up to {MAX_LITERAL:g} (and True/False) may be written, found {_short(node.value)}")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords:
                raise ConditionError(f"only these functions can be called, with plain arguments: {', '.join(FUNCTIONS)}")
        elif isinstance(node, ast.Attribute):
            if not isinstance(node.value, ast.Name) or node.value.id not in metrics:
                raise ConditionError(f"'.{node.attr}' must follow a metric name ({_known(metrics)})")
            if node.attr.startswith("_"):
                raise ConditionError(f"'.{node.attr}': names starting with '_' are not allowed")
            fields.add((node.value.id, node.attr))
        elif isinstance(node, ast.Name):
            if "_" == node.id[:1] or "__" in node.id:
                raise ConditionError(f"'{node.id}': names starting with '_' are not allowed")
            if node.id not in FUNCTIONS and node.id not in metrics and node.id not in SCALARS:
                raise ConditionError(f"unknown name '{node.id}'; conditions may read {_known(metrics)}, {', '.join(SCALARS)}")
            names.add(node.id)
    for node in nodes:
        if isinstance(node, ast.Name) and node.id in FUNCTIONS and not _is_called(node, nodes):
            raise ConditionError(f"'{node.id}' is a function: call it, as in {node.id}(history.loss)")
    return Condition(text=text, tree=tree.body, fields=frozenset(fields), names=frozenset(names - set(FUNCTIONS)))


def evaluate(condition: Condition, values: Mapping[str, Any], budget_s: float) -> bool:
    """The condition's truth over plain values (metric name -> dict of fields; scalars); False while a window is too short.

    Raises ConditionError when it does not give true or false (which `typecheck` refuses beforehand), or takes
    longer than `budget_s`; the controller makes that a logged false, never a failed run.
    """
    evaluator = _Evaluator(values, time.perf_counter() + budget_s)
    try:
        result = evaluator.eval(condition.text, previously_parsed=condition.tree)
    except (NotEnoughData, IndexError):
        return False
    except ConditionError:
        raise
    except (RecursionError, MemoryError, OverflowError) as e:
        raise ConditionError(f"evaluating it failed ({type(e).__name__})") from e
    except Exception as e:  # simpleeval's own refusals and a TypeError from a misused field
        raise ConditionError(f"evaluating it failed: {e}") from e
    if not isinstance(result, bool):
        raise ConditionError(f"it must be true or false, but gave {_short(result)}: compare it, as in '... > 0.5'")
    return result


class _Evaluator(SimpleEval):
    """simpleeval with only the allow-listed nodes, dict-key attribute lookup and a deadline."""

    def __init__(self, names: Mapping[str, Any], deadline: float) -> None:
        super().__init__(operators=OPERATORS, functions=FUNCTIONS, names=dict(names))
        allowed = {ast.Name, ast.UnaryOp, ast.BinOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call, ast.Subscript, ast.Attribute,
                   ast.Slice, ast.Constant}
        self.nodes = {kind: handler for kind, handler in self.nodes.items() if kind in allowed}
        self.deadline = deadline

    def _eval(self, node: ast.AST) -> Any:
        if time.perf_counter() > self.deadline:
            raise ConditionError("it took longer than its time budget (control.budget_ms); simplify it")
        return super()._eval(node)

    def _eval_attribute(self, node: ast.Attribute) -> Any:
        owner = self._eval(node.value)
        if not isinstance(owner, dict) or node.attr not in owner:
            raise ConditionError(f"no field '{node.attr}' here")
        return owner[node.attr]

    def _eval_subscript(self, node: ast.Subscript) -> Any:
        container, key = self._eval(node.value), self._eval(node.slice)
        if not isinstance(container, list):
            raise ConditionError(f"only windows (lists) can be indexed, found {type(container).__name__}")
        if not isinstance(key, slice) and (isinstance(key, bool) or not isinstance(key, int)):
            raise ConditionError(f"a window index is a whole number, found {_short(key)}")
        return container[key]


def _is_small_number(value: Any) -> bool:
    return isinstance(value, bool) or (isinstance(value, int | float) and not isinstance(value, complex) and abs(value) <= MAX_LITERAL)


def _is_called(name: ast.Name, nodes: list[ast.AST]) -> bool:
    return any(isinstance(node, ast.Call) and node.func is name for node in nodes)


def _describe(node: ast.AST) -> str:
    return {ast.ListComp: "a comprehension", ast.GeneratorExp: "a comprehension", ast.Lambda: "a lambda", ast.JoinedStr: "an f-string",
            ast.NamedExpr: "':='"}.get(type(node), f"'{type(node).__name__}'")


def _known(metrics: Mapping[str, Any]) -> str:
    return ", ".join(sorted(metrics)) or "no metrics (declare them under control.metrics)"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
