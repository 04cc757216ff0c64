"""Static types of rule conditions: `factory check` proves a condition gives true or false, or refuses it.

Every sub-expression gets a type: `Bool`, `Number` (with a bound on its size when one can be
proved) or `Window` (a list of numbers of at most `length` values, empty included). A condition
is accepted only when its type is `Bool` on every branch, whatever the windows hold and however
long they are; so `and`/`or` (which return an operand in Python) take only true/false operands,
`x if c else y` needs a true/false `c` and branches of one type, comparisons and arithmetic take
numbers, and each function takes what its signature says. Growth is bounded too: `**` needs a
literal exponent of at most MAX_EXPONENT and, above 1, a base whose size is known (literals,
`step`, `steps`, `len()`, counts), and arithmetic on known sizes must stay under MAX_NUMBER for every
step up to the planned steps. Values read from training (losses, norms) have no bound: at run
time their arithmetic is float arithmetic, so they may become inf or nan, which compare false
(see `expression`).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from factory.train.control.expression import FUNCTIONS, MAX_EXPONENT, MAX_NUMBER, SCALARS, ConditionError


@dataclass(frozen=True, slots=True)
class Bool:
    """True or false."""

    def __str__(self) -> str:
        return "true/false"


@dataclass(frozen=True, slots=True)
class Number:
    """A number whose size is at most `bound` (inf: unknown, as for values read from training; they may be nan or inf)."""

    bound: float = math.inf

    def __str__(self) -> str:
        return "a number"


@dataclass(frozen=True, slots=True)
class Window:
    """A list of 0 to `length` numbers (inf: no known limit), each of size at most `item`."""

    length: float
    item: Number = Number()

    def __str__(self) -> str:
        return "a window (a list of numbers)"


@dataclass(frozen=True, slots=True)
class Metric:
    """A bare metric name: only its fields are values."""

    name: str

    def __str__(self) -> str:
        return f"the metric {self.name!r} (read one of its fields, as in {self.name}.<field>)"


Type = Bool | Number | Window | Metric
Schema = Mapping[str, Mapping[str, Number | Window]]
"""Metric name -> field -> type of the field."""


def check_types(tree: ast.expr, schema: Schema, steps: int) -> None:
    """Refuse (ConditionError, naming the part) a condition that is not true/false on every branch or can outgrow MAX_NUMBER."""
    found = _Checker(schema, steps).type(tree)
    if not isinstance(found, Bool):
        raise ConditionError(f"it must be true or false, but gives {found}: compare it, as in '{_text(tree)} > 0.5'")


def _text(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


def _product(a: float, b: float) -> float:
    return 0.0 if a == 0 or b == 0 else a * b


def _power(base: float, exponent: float) -> float:
    """The largest size of x ** exponent for sizes of x up to `base` (exponent >= 0)."""
    if exponent != int(exponent) and base < 1:
        return 1.0
    try:
        return base ** exponent
    except OverflowError:
        return math.inf


class _Checker:
    """Gives each node its type (a `_<node kind>` method per allowed kind), refusing on the first part that does not fit."""

    def __init__(self, schema: Schema, steps: int) -> None:
        self.schema, self.steps = schema, steps

    def type(self, node: ast.expr) -> Type:
        handler: Callable[[ast.expr], Type] | None = getattr(self, f"_{type(node).__name__.lower()}", None)
        if handler is None:
            raise ConditionError(f"'{_text(node)}' is not allowed in a condition")
        return handler(node)

    def expect(self, node: ast.expr, kind: type, why: str) -> Type:
        found = self.type(node)
        if not isinstance(found, kind):
            raise ConditionError(f"{why}, but '{_text(node)}' is {found}")
        return found

    def number(self, node: ast.expr, why: str) -> Number:
        found = self.expect(node, Number, why)
        assert isinstance(found, Number)
        return found

    def _constant(self, node: ast.Constant) -> Type:
        if isinstance(node.value, bool):
            return Bool()
        return Number(float(abs(node.value)))

    def _name(self, node: ast.Name) -> Type:
        if node.id in SCALARS:
            return Number(float(self.steps))
        if node.id in self.schema:
            return Metric(node.id)
        raise ConditionError(f"unknown name '{node.id}'")

    def _attribute(self, node: ast.Attribute) -> Type:
        owner = node.value.id if isinstance(node.value, ast.Name) else None
        fields = self.schema.get(owner or "")
        if fields is None or node.attr not in fields:
            raise ConditionError(f"'{_text(node)}' is not a field of a metric")
        return fields[node.attr]

    def _boolop(self, node: ast.BoolOp) -> Type:
        word = "and" if isinstance(node.op, ast.And) else "or"
        for value in node.values:
            self.expect(value, Bool, f"'{word}' gives one of its operands, so each must be true/false")
        return Bool()

    def _unaryop(self, node: ast.UnaryOp) -> Type:
        if isinstance(node.op, ast.Not):
            self.expect(node.operand, Bool, "'not' takes true/false")
            return Bool()
        return self.number(node.operand, "'-' and '+' take a number")

    def _compare(self, node: ast.Compare) -> Type:
        for operand in (node.left, *node.comparators):
            self.number(operand, "comparisons need numbers (index a window as x[-1] or reduce it as mean(x))")
        return Bool()

    def _ifexp(self, node: ast.IfExp) -> Type:
        self.expect(node.test, Bool, "the test of 'x if test else y' must be true/false")
        body, orelse = self.type(node.body), self.type(node.orelse)
        if type(body) is not type(orelse) or isinstance(body, Metric):
            raise ConditionError(f"both branches of '{_text(node)}' must be true/false (or both numbers), "
                                 f"but '{_text(node.body)}' is {body} and '{_text(node.orelse)}' is {orelse}")
        if isinstance(body, Number) and isinstance(orelse, Number):
            return Number(max(body.bound, orelse.bound))
        if isinstance(body, Window) and isinstance(orelse, Window):
            return Window(max(body.length, orelse.length), Number(max(body.item.bound, orelse.item.bound)))
        return body

    def _binop(self, node: ast.BinOp) -> Type:
        symbol = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**"}[type(node.op)]
        left = self.number(node.left, f"'{symbol}' takes numbers (index a window as x[-1] or reduce it as mean(x))")
        if symbol == "**":
            return self._power(node, left)
        right = self.number(node.right, f"'{symbol}' takes numbers (index a window as x[-1] or reduce it as mean(x))")
        if symbol in ("/", "//"):
            divisor = _literal(node.right)
            # By a number written out the size is known; by anything else it may be inf (x / 0 is inf or nan, never an error).
            if not divisor:
                return Number(math.inf)
            return self._bounded(node, left.bound / abs(divisor) + (symbol == "//"), finite_operands=math.isfinite(left.bound))
        bound = {"+": left.bound + right.bound, "-": left.bound + right.bound, "*": _product(left.bound, right.bound), "%": right.bound}[symbol]
        return self._bounded(node, bound, finite_operands=math.isfinite(left.bound) and math.isfinite(right.bound))

    def _power(self, node: ast.BinOp, base: Number) -> Type:
        exponent = _literal(node.right)
        if exponent is None or abs(exponent) > MAX_EXPONENT:
            raise ConditionError(f"'{_text(node)}': the exponent of '**' must be a number written out, at most {MAX_EXPONENT}")
        if 0 <= exponent <= 1:  # a root (or x ** 0) never grows past max(1, |x|)
            return Number(max(1.0, base.bound))
        if not math.isfinite(base.bound):
            raise ConditionError(f"'{_text(node)}': '**' above 1 needs a base of known size (numbers, step, steps, len(), counts), "
                                 f"and '{_text(node.left)}' can be any size: multiply it out (x * x)")
        if exponent < 0:  # 1 / x ** n: like a division, it may be inf (0 ** -1), never an error
            return Number(math.inf)
        return self._bounded(node, _power(base.bound, exponent), finite_operands=True)

    def _bounded(self, node: ast.BinOp, bound: float, finite_operands: bool) -> Number:
        if finite_operands and bound > MAX_NUMBER:
            reach = f"{bound:.3g}" if math.isfinite(bound) else "more than a float holds"
            raise ConditionError(f"'{_text(node)}' can reach {reach} by step {self.steps}, beyond {MAX_NUMBER:g}: "
                                 "bound it (smaller exponents, fewer products)")
        return Number(bound)

    def _subscript(self, node: ast.Subscript) -> Type:
        window = self.expect(node.value, Window, "only windows can be indexed")
        assert isinstance(window, Window)
        index = node.slice
        if isinstance(index, ast.Slice):
            parts = (index.lower, index.upper, index.step)
            if any(part is not None and not isinstance(_literal(part), int) for part in parts) or _literal(index.step) == 0:
                raise ConditionError(f"'{_text(node)}': slice bounds are whole numbers written out, as in x[-3:]")
            return window
        if not isinstance(_literal(index), int):
            raise ConditionError(f"'{_text(node)}': a window index is a whole number written out, as in x[-1]")
        return window.item

    def _call(self, node: ast.Call) -> Type:
        name = _called(node)
        if name not in SIGNATURES:
            raise ConditionError(f"'{_text(node)}': only these functions can be called: {', '.join(FUNCTIONS)}")
        return SIGNATURES[name](self, node)


def _literal(node: ast.expr | None) -> int | float | None:
    """The value of a number written out (with an optional sign), else None."""
    sign = 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        sign, node = (-1 if isinstance(node.op, ast.USub) else 1), node.operand
    if isinstance(node, ast.Constant) and not isinstance(node.value, bool) and isinstance(node.value, int | float):
        return sign * node.value
    return None


def _called(node: ast.Call) -> str:
    return node.func.id if isinstance(node.func, ast.Name) else "?"


def _one(node: ast.Call, what: str) -> ast.expr:
    name = _called(node)
    if len(node.args) != 1:
        raise ConditionError(f"'{_text(node)}': {name}() takes one {what}")
    return node.args[0]


def _window_to(result: Callable[[Window], Type]) -> Callable[[_Checker, ast.Call], Type]:
    def check(checker: _Checker, node: ast.Call) -> Type:
        window = checker.expect(_one(node, "window"), Window, f"{_called(node)}() takes a window")
        assert isinstance(window, Window)
        return result(window)

    return check


def _number_to(result: Callable[[Number], Type]) -> Callable[[_Checker, ast.Call], Type]:
    def check(checker: _Checker, node: ast.Call) -> Type:
        return result(checker.number(_one(node, "number"), f"{_called(node)}() takes a number"))

    return check


def _extreme(checker: _Checker, node: ast.Call) -> Type:
    """min/max: of one window, or of two or more numbers."""
    name = _called(node)
    if len(node.args) == 1:
        window = checker.expect(node.args[0], Window, f"{name}() of one argument takes a window (or give it two numbers or more)")
        assert isinstance(window, Window)
        return window.item
    if not node.args:
        raise ConditionError(f"'{_text(node)}': {name}() takes a window or two numbers or more")
    return Number(max(checker.number(arg, f"{name}() of several arguments takes numbers").bound for arg in node.args))


SIGNATURES: dict[str, Callable[[_Checker, ast.Call], Type]] = {
    "len": _window_to(lambda w: Number(w.length)),
    "min": _extreme,
    "max": _extreme,
    "sum": _window_to(lambda w: Number(_product(w.length, w.item.bound))),
    "mean": _window_to(lambda w: w.item),
    "std": _window_to(lambda w: Number(2 * w.item.bound)),
    "abs": _number_to(lambda n: n),
    "isfinite": _number_to(lambda n: Bool()),
}
"""The type of each function of `expression.FUNCTIONS` (same keys): what it takes, what it gives."""
