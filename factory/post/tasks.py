"""Code-execution tasks: (function source, call, expected output) rows from a seeded program generator.

Each family writes a small function `f` from seeded choices (constants, operators, branches)
and draws inputs for it; the expected output is what executing `print(repr(f(...)))` printed
in the sandbox, never what the generator believes. A call that fails or runs out of time is
left out (and counted). Beside them, pure functions mined from the standard library
(`factory.post.mined`, family `stdlib`) are tried with pool arguments; the calls that run and
print a short value make tasks. Splits go by the hash of the function's source, so every call of a
function lands in the same split: no function is seen in training and tested on.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from factory.post.mined import MinedFunction, draw_calls, good_output, pure_functions, stdlib_sources
from factory.post.sandbox import Limits, Sandbox

MAX_REPEATS = 50
"""A family whose generator repeated an earlier function this often has no new ones left."""
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
    k, m = rng.randint(2, 5), rng.randint(2, 4)
    r0 = rng.randrange(m)
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
    n, key, letters = rng.randint(1, 4), rng.choice(["(-kv[1], kv[0])", "kv[0]", "(kv[1], kv[0])"]), rng.choice(["abcab", "xyzzy", "mississippi"])
    start = rng.randint(0, 2)
    source = (f"def f(s):\n    counts = {{}}\n    for c in s[{start}:]:\n        counts[c] = counts.get(c, 0) + 1\n"
              f"    return sorted(counts.items(), key=lambda kv: {key})[:{n}]\n")
    return Program(family="dict", difficulty="medium", source=source,
                   arguments=lambda r: ("".join(r.choice(letters) for _ in range(r.randint(3, 9))),))


def _recursion(rng: random.Random) -> Program:
    a, b, op, step = rng.randint(1, 4), rng.randint(0, 3), rng.choice(["+", "-"]), rng.choice([1, 2])
    source = f"def f(n):\n    if n <= {b}:\n        return n + {a}\n    return f(n - 1) {op} f(n - {step} - 1) * {a}\n"
    return Program(family="recursion", difficulty="hard", source=source, arguments=lambda r: (r.randint(0, 12),))


def _nested(rng: random.Random) -> Program:
    k, op = rng.randint(2, 9), rng.choice(["+", "*", "-"])
    residue = rng.randrange(min(k, 3))
    source = (f"def f(xs, ys):\n    pairs = []\n    for x in xs:\n        for y in ys:\n            if (x {op} y) % {k} == {residue}:\n"
              f"                pairs.append((x, y))\n    return len(pairs), pairs[:2]\n")
    return Program(family="nested", difficulty="hard", source=source,
                   arguments=lambda r: ([r.randint(0, 9) for _ in range(r.randint(1, 5))], [r.randint(0, 9) for _ in range(r.randint(1, 5))]))


FAMILIES: tuple[Callable[[random.Random], Program], ...] = (_arith, _strings, _lists, _loops, _branches, _dicts, _recursion, _nested)


def split_of(source: str) -> str:
    """The split of a function, from the hash of its source."""
    bucket = int(hashlib.sha256(source.encode()).hexdigest(), 16) % 100
    return next(name for name, bound in SPLITS if bucket < bound)


def programs(count: int, seed: int) -> Iterator[Program]:
    """Up to `count` distinct seeded functions, an equal share per family (fewer for a family with fewer distinct ones)."""
    rng, seen, quota = random.Random(seed), set(), -(-count // len(FAMILIES))
    made, misses, turn = [0] * len(FAMILIES), [0] * len(FAMILIES), 0
    while any(m < quota and r < MAX_REPEATS for m, r in zip(made, misses, strict=True)):
        family, turn = turn % len(FAMILIES), turn + 1
        if made[family] >= quota or misses[family] >= MAX_REPEATS:
            continue
        program = FAMILIES[family](rng)
        if program.source in seen:
            misses[family] += 1
            continue
        seen.add(program.source)
        made[family] += 1
        yield program


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskSet:
    """The generated rows, and how many calls were left out because they failed in the sandbox."""

    rows: pa.Table
    dropped: int


def generate(count: int, calls: int, seed: int, sandbox: Sandbox | None = None, stdlib_functions: int = 0) -> TaskSet:
    """Tasks for up to `count` generated functions and `stdlib_functions` mined ones, up to `calls` distinct calls each;
    expected outputs from executing them."""
    rng = random.Random(seed + 1)
    pending: list[tuple[str, str, str, str]] = []  # family, difficulty, source, call
    for program in programs(count, seed):
        drawn = [f"f({', '.join(repr(a) for a in program.arguments(rng))})" for _ in range(calls * 3)]
        pending += [(program.family, program.difficulty, program.source, call) for call in list(dict.fromkeys(drawn))[:calls]]
    generated = len(pending)
    for function in mined(stdlib_functions, seed):  # more calls tried than kept: many inputs do not suit a given function
        pending += [("stdlib", _difficulty(function.source), function.source, call) for call in draw_calls(function, rng, calls * 3)]
    sandbox = sandbox or Sandbox(Limits(cpu_s=1, wall_s=3, memory_mb=128), workers=2)
    outcomes = sandbox.run_many([f"{source}\nprint(repr({call}))\n" for _, _, source, call in pending])
    rows, kept = [], Counter()
    for i, ((family, difficulty, source, call), outcome) in enumerate(zip(pending, outcomes, strict=True)):
        if outcome.status != "ok" or (i >= generated and (kept[source] >= calls or not good_output(outcome.stdout))):
            continue
        kept[source] += 1
        row = {"function": source, "call": call, "expected": outcome.stdout.strip(), "family": family, "difficulty": difficulty,
               "split": split_of(source)}
        digest = hashlib.sha256(json.dumps(row, sort_keys=True).encode()).hexdigest()
        rows.append({"id": digest[:16], "sha256": digest, "bytes": len(source), **row})
    dropped = generated - sum(1 for row in rows if row["family"] != "stdlib")
    return TaskSet(rows=pa.Table.from_pylist(rows, schema=TASK_SCHEMA), dropped=dropped)


def mined(count: int, seed: int) -> list[MinedFunction]:
    """`count` pure functions of the standard library, drawn by seed (none when count is 0)."""
    if count <= 0:
        return []
    found = pure_functions(stdlib_sources())
    return random.Random(seed).sample(found, min(count, len(found)))


def _difficulty(source: str) -> str:
    lines = source.count("\n")
    return "easy" if lines <= 3 else "medium" if lines <= 7 else "hard"
