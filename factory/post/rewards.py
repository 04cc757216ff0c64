"""The reward of a completion: does executing `assert repr(<call>) == repr(<its answer>)` pass, and is the answer well formed?

An answer must be a Python literal on one line (a call such as `f(3)` would pass its own
assertion, so it earns nothing). A literal answer is checked by executing the task's function
and an assertion that the call's value is written as the answer's value is (the benchmark's rule:
`1.0` is not `True`) in the sandbox, under the harness HumanEval is scored with
(`factory.post.execute`): 1 when it passes, plus `format_reward` for the well-formed literal.
Anything else earns 0. Answers repeated within a batch are executed once.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass

from factory.post.execute import check_programs
from factory.post.format import answer_line, literal
from factory.post.sandbox import Sandbox


@dataclass(frozen=True, kw_only=True, slots=True)
class Reward:
    value: float
    passed: bool
    formatted: bool
    """The answer was a literal, and the completion ended its line."""


def check_source(function: str, call: str, line: str) -> str:
    """The program whose clean exit means the answer is right: the call's value is written as the answer's literal is
    (`1.0` is not `True`, `{3}` is not `frozenset({3})`: the `code_exec` benchmark's rule), both written in the
    sandbox, so sets of strings print in the same order."""
    literal(line)  # only a literal gets here: nothing else of the answer is executed
    written = ast.unparse(ast.parse(line, mode="eval").body)  # comments and layout dropped
    return f"{function}\nassert repr({call}) == repr({written})\n"


def rewards(
    tasks: Sequence[dict], completions: Sequence[str], sandbox: Sandbox, format_reward: float
) -> list[Reward]:
    """The reward of each completion of the task beside it (tasks rows hold `function` and `call`)."""
    lines, formatted = [], []
    for text in completions:
        line = answer_line(text)
        try:
            literal(line)
            well_formed = bool(line) and "\n" in text
        except ValueError:
            line, well_formed = "", False
        lines.append(line)
        formatted.append(well_formed)
    checks = {
        check_source(task["function"], task["call"], line): None for task, line in zip(tasks, lines, strict=True) if line
    }
    verdicts = check_programs(list(checks), sandbox, timeout_s=sandbox.limits.cpu_s)  # as HumanEval's are run
    outcomes = dict(zip(checks, (v.passed for v in verdicts), strict=True))
    result = []
    for task, line, well_formed in zip(tasks, lines, formatted, strict=True):
        passed = bool(line) and outcomes[check_source(task["function"], task["call"], line)]
        result.append(Reward(value=float(passed) + (format_reward if well_formed else 0.0), passed=passed, formatted=well_formed))
    return result
