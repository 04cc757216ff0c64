"""Code-execution tasks: (function source, call, expected output) rows from a seeded program generator.

Each family writes a small function `f` from seeded choices (constants, operators, branches)
and draws inputs for it; the expected output is what executing `print(repr(f(...)))` printed
in the sandbox, never what the generator believes. A call that fails or runs out of time is
left out (and counted). Splits go by the hash of the function's source, so every call of a
function lands in the same split: no function is seen in training and tested on.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from factory.post.sandbox import Limits, Sandbox

SPLITS = (("train", 80), ("validation", 90), ("test", 100))
"""Function-hash bucket (0-99) below the bound -> split."""
TASK_SCHEMA = pa.schema([
    ("id", pa.string()), ("sha256", pa.string()), ("bytes", pa.int64()), ("function", pa.string()), ("call", pa.string()),
    ("expected", pa.string()), ("family", pa.string()), ("difficulty", pa.string()), ("split", pa.string()),
])


@dataclass(frozen=True, kw_only=True, slots=True)
class Program:
    """One generated function and how to draw arguments for it."""

    family: str
    difficulty: str
    source: str
    arguments: Callable[[random.Random], tuple]


def _arith(rng: random.Random) -> Program:
    a, b, op = rng.randint(2, 9), rng.randint(1, 20), rng.choice(["+", "-", "*"])
    source = f"def f(x, y):\n    return (x {op} {a}) * y - {b}\n"
    return Program(family="arithmetic", difficulty="easy", source=source, arguments=lambda r: (r.randint(-20, 20), r.randint(-5, 5)))


def _strings(rng: random.Random) -> Program:
    step, suffix, method = rng.choice([1, 2, -1]), rng.choice("xyz!#"), rng.choice(["upper", "lower", "swapcase", "title"])
    source = f"def f(s):\n    t = s[::{step}].{method}()\n    return t + {suffix!r} * len(s.split())\n"
    words = ["alpha", "Beta", "gamma ray", "Delta", "eps ilon", "zeta"]
    return Program(family="string", difficulty="easy", source=source, arguments=lambda r: (" ".join(r.sample(words, r.randint(1, 3))),))


def _lists(rng: random.Random) -> Program:
    k, m, r0 = rng.randint(2, 5), rng.randint(2, 4), 0
    key = rng.choice(["x", "-x", "x % 3", "abs(x - 4)"])
    source = f"def f(xs):\n    kept = [x * {k} for x in xs if x % {m} == {r0}]\n    return sorted(kept, key=lambda x: {key})[:4]\n"
    return Program(family="list", difficulty="medium", source=source, arguments=lambda r: ([r.randint(-9, 9) for _ in range(r.randint(3, 8))],))


def _loops(rng: random.Random) -> Program:
    k, limit = rng.randint(2, 5), rng.randint(20, 60)
    source = (f"def f(n):\n    total, i = 0, 0\n    while total < {limit} and i < n:\n        if i % {k} == 0:\n"
              f"            total += i\n        else:\n            total -= 1\n        i += 1\n    return total, i\n")
    return Program(family="loop", difficulty="medium", source=source, arguments=lambda r: (r.randint(0, 40),))


def _branches(rng: random.Random) -> Program:
    low, high = sorted(rng.sample(range(-10, 30), 2))
    labels = rng.sample(["cold", "mild", "warm", "hot", "zero"], 3)
    source = (f"def f(t):\n    if t < {low}:\n        return {labels[0]!r}\n    elif t < {high}:\n        return {labels[1]!r} + str(t % 7)\n"
              f"    return {labels[2]!r}\n")
    return Program(family="conditional", difficulty="easy", source=source, arguments=lambda r: (r.randint(-15, 40),))


def _dicts(rng: random.Random) -> Program:
    n = rng.randint(1, 3)
    source = f"def f(s):\n    counts = {{}}\n    for c in s:\n        counts[c] = counts.get(c, 0) + 1\n    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:{n}]\n"
    return Program(family="dict", difficulty="medium", source=source, arguments=lambda r: ("".join(r.choice("abcab") for _ in range(r.randint(3, 9))),))


def _recursion(rng: random.Random) -> Program:
    a, b = rng.randint(1, 3), rng.randint(0, 2)
    source = f"def f(n):\n    if n <= {b}:\n        return n + {a}\n    return f(n - 1) + f(n - 2) * {a}\n"
    return Program(family="recursion", difficulty="hard", source=source, arguments=lambda r: (r.randint(0, 12),))


def _nested(rng: random.Random) -> Program:
    k = rng.randint(2, 6)
    source = (f"def f(xs, ys):\n    pairs = []\n    for x in xs:\n        for y in ys:\n            if (x + y) % {k} == 0:\n"
              f"                pairs.append((x, y))\n    return len(pairs), pairs[:2]\n")
    return Program(family="nested", difficulty="hard", source=source,
                   arguments=lambda r: ([r.randint(0, 9) for _ in range(r.randint(1, 5))], [r.randint(0, 9) for _ in range(r.randint(1, 5))]))


FAMILIES: tuple[Callable[[random.Random], Program], ...] = (_arith, _strings, _lists, _loops, _branches, _dicts, _recursion, _nested)


def split_of(source: str) -> str:
    """The split of a function, from the hash of its source."""
    bucket = int(hashlib.sha256(source.encode()).hexdigest(), 16) % 100
    return next(name for name, bound in SPLITS if bucket < bound)


def programs(count: int, seed: int) -> Iterator[Program]:
    """`count` distinct seeded functions, cycling through the families."""
    rng, seen = random.Random(seed), set()
    attempts = 0
    while len(seen) < count and attempts < count * 20:
        attempts += 1
        program = FAMILIES[attempts % len(FAMILIES)](rng)
        if program.source not in seen:
            seen.add(program.source)
            yield program


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskSet:
    """The generated rows, and how many calls were left out because they failed in the sandbox."""

    rows: pa.Table
    dropped: int


def generate(count: int, calls: int, seed: int, sandbox: Sandbox | None = None) -> TaskSet:
    """Tasks for `count` functions with `calls` distinct calls each; expected outputs from executing them."""
    rng = random.Random(seed + 1)
    pending: list[tuple[Program, str]] = []
    for program in programs(count, seed):
        chosen = {f"f({', '.join(repr(a) for a in program.arguments(rng))})" for _ in range(calls * 3)}
        pending += [(program, call) for call in sorted(chosen)[:calls]]
    sandbox = sandbox or Sandbox(Limits(cpu_s=1, wall_s=3, memory_mb=128), workers=2)
    outcomes = sandbox.run_many([f"{program.source}\nprint(repr({call}))\n" for program, call in pending])
    rows = []
    for (program, call), outcome in zip(pending, outcomes, strict=True):
        if outcome.status != "ok":
            continue
        row = {"function": program.source, "call": call, "expected": outcome.stdout.strip(), "family": program.family,
               "difficulty": program.difficulty, "split": split_of(program.source)}
        digest = hashlib.sha256(json.dumps(row, sort_keys=True).encode()).hexdigest()
        rows.append({"id": digest[:16], "sha256": digest, "bytes": len(program.source), **row})
    return TaskSet(rows=pa.Table.from_pylist(rows, schema=TASK_SCHEMA), dropped=len(pending) - len(rows))
