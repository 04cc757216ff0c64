"""How a code-execution task is written for a model: one format for fine-tuning, rewards and the benchmark.

The prompt is the function, then `assert <call> ==`; the model's answer is what it writes up to
the end of the line. Ending the prompt on `==` leaves the space before the value to the value's
token, as the tokenizer saw it in code.
"""

from __future__ import annotations

import ast


def prompt(function: str, call: str) -> str:
    """What the model continues."""
    return f"{function}\nassert {call} =="


def completion(expected: str) -> str:
    """What a right answer looks like: the output, then the end of the line."""
    return f" {expected}\n"


def answer_line(text: str) -> str:
    """The model's answer as written: its first line, stripped."""
    return text.split("\n", 1)[0].strip()


def literal(text: str) -> object:
    """The Python value an answer writes, or raises ValueError when it is not a literal."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
        raise ValueError(f"not a Python literal: {text[:80]!r}") from e


def answer(text: str) -> str:
    """The answer, written as Python writes the value when it is a literal (quotes do not matter), else as written."""
    line = answer_line(text)
    try:
        return repr(literal(line))
    except ValueError:
        return line
