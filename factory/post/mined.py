"""Pure functions mined from the standard library, for code-execution tasks beside the generated ones.

A top-level function qualifies when it is small (at most MAX_LINES once its docstring is gone),
takes one or two plain positional parameters, and can only touch what it is given: every name it
reads is a parameter, a local, itself or a harmless builtin (no module globals, no imports, no
`global`, no generators, no classes, no private attributes). Its source is re-written by
`ast.unparse`: comments and docstrings dropped, one layout. Arguments come from a pool of small
values of common types; which calls make tasks is decided by executing them in the sandbox.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_LINES = 12
MAX_CHARS = 500
SAFE_BUILTINS = frozenset({
    "abs", "all", "any", "bool", "bytes", "chr", "dict", "divmod", "enumerate", "filter", "float", "frozenset", "hex", "int",
    "isinstance", "iter", "len", "list", "map", "max", "min", "next", "oct", "ord", "range", "repr", "reversed", "round", "set",
    "sorted", "str", "sum", "tuple", "zip", "IndexError", "KeyError", "TypeError", "ValueError",
})
BANNED = (
    ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.Yield, ast.YieldFrom, ast.Await, ast.With, ast.AsyncWith,
    ast.AsyncFor, ast.ClassDef, ast.Delete, ast.Lambda,
)
POOL: tuple[object, ...] = (
    0, 1, 2, 3, 7, 10, -4, 255, "", "a", "abc", "Hello, World", "a b  c", "x1y2", "__init__", "3.14", "path/to/file.py",
    [], [1, 2, 3], [3, 1, 2, 2], ["b", "a"], (1, 2), {"a": 1, "b": 2}, True, False, None, 2.5,
)
"""Arguments a mined function is tried with: small values of the types stdlib helpers take."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MinedFunction:
    name: str
    source: str
    parameters: int
    origin: str
    """The stdlib module it came from."""


def stdlib_sources(root: Path | None = None) -> Iterator[tuple[str, str]]:
    """(module path, text) of the running interpreter's standard library, tests and IDLE left out, in path order."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if {"test", "tests", "idlelib", "site-packages", "lib2to3"} & set(parts):
            continue
        try:
            yield str(path.relative_to(root)), path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue


def pure_functions(sources: Iterable[tuple[str, str]]) -> list[MinedFunction]:
    """The qualifying functions of the sources, each distinct source once, in the order found."""
    found: dict[str, MinedFunction] = {}
    for origin, text in sources:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and (source := _qualifies(node)) is not None and source not in found:
                found[source] = MinedFunction(name=node.name, source=source + "\n", parameters=len(node.args.args), origin=origin)
    return list(found.values())


def _qualifies(node: ast.FunctionDef) -> str | None:
    """The function's re-written source when it qualifies, else None."""
    args = node.args
    if node.decorator_list or args.vararg or args.kwarg or args.kwonlyargs or args.defaults or args.posonlyargs:
        return None
    if not 1 <= len(args.args) <= 2 or node.name.startswith("__"):
        return None
    body = node.body[1:] if _is_docstring(node.body[0]) else node.body
    if not body or not any(isinstance(n, ast.Return) and n.value is not None for stmt in body for n in ast.walk(stmt)):
        return None
    bare = ast.fix_missing_locations(ast.FunctionDef(name=node.name, args=args, body=body, decorator_list=[], returns=None,
                                                     type_params=[]))
    nodes = list(ast.walk(bare))
    for n in nodes:  # annotations may name module globals; they are not code the call runs
        if isinstance(n, ast.arg):
            n.annotation = None
    nodes = list(ast.walk(bare))
    if any(isinstance(n, BANNED) for n in nodes) or any(isinstance(n, ast.Attribute) and n.attr.startswith("_") for n in nodes):
        return None
    local = {node.name} | {n.arg for n in nodes if isinstance(n, ast.arg)}
    local |= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    local |= {n.name for n in nodes if isinstance(n, ast.ExceptHandler) and n.name}
    if any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in local | SAFE_BUILTINS for n in nodes):
        return None
    source = ast.unparse(bare)
    return source if source.count("\n") < MAX_LINES and len(source) <= MAX_CHARS else None


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) and isinstance(statement.value.value, str)


def draw_calls(function: MinedFunction, rng: random.Random, tries: int) -> list[str]:
    """Up to `tries` distinct calls of the function with arguments from POOL, in the order drawn."""
    calls = (f"{function.name}({', '.join(repr(rng.choice(POOL)) for _ in range(function.parameters))})" for _ in range(tries * 3))
    return list(dict.fromkeys(calls))[:tries]


def good_output(text: str) -> bool:
    """Whether an executed call's printed value can be an expected output: short, one line, no object addresses."""
    text = text.strip()
    return 0 < len(text) <= 60 and "\n" not in text and " at 0x" not in text and not text.startswith("<")
