"""Next-line exact match: can the model write the next line of a held-out Python function?

A target is a non-blank, non-comment line inside a function body (never a `def` line). Its prompt
is the document up to the last non-whitespace character before the line, so the model must end the
previous line and write the indentation itself. Cutting there, rather than after the newline or
the indentation, cuts between two pre-tokens of the byte-level BPE: the prompt's tokens are exactly
the document's first tokens, as the model saw them in training.

Only lines with at least `PROMPT_TOKENS` tokens before them and fewer than `MAX_NEW_TOKENS` of their
own (newline and indentation included, one token left for the newline that ends them) are eligible,
so the set of lines depends on the data, the tokenizer and the seed but not on the model's context.
Every prompt is cut to the same length, which depends on the context only.
"""

from __future__ import annotations

import ast
import random
import warnings
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tokenizers import Tokenizer

from factory.errors import ConfigError
from factory.evals.base import EvalInputs, Score
from factory.models.generate import generate
from factory.models.sampling import Sampling

LINES = 64
PROMPT_TOKENS = 128
MAX_NEW_TOKENS = 32
EXAMPLES = 3
EXAMPLE_CHARS = 80


@dataclass(frozen=True, kw_only=True, slots=True)
class Line:
    """A target line and where it starts in its document's tokens."""

    tokens: Sequence[int] = field(repr=False)
    """The whole document's tokens, shared by its lines."""
    start: int
    """How many of `tokens` come before the line: the prompt."""
    target: str
    """The line with its indentation, without trailing whitespace."""
    prompt_tail: str
    """The last characters of the prompt, for the report."""

    def prompt(self, length: int) -> list[int]:
        """The last `length` tokens before the line."""
        return list(self.tokens[self.start - length : self.start])


def function_body_lines(source: str) -> list[int]:
    """0-based numbers of the lines inside function bodies, signatures excluded; [] if `source` does not parse."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", (SyntaxWarning, DeprecationWarning))
            tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return []
    body: set[int] = set()
    signatures: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0].lineno
            body.update(range(first, node.end_lineno + 1))
            signatures.update(range(node.lineno, max(first, node.lineno + 1)))
    return sorted(n - 1 for n in body - signatures)


def _document_lines(source: str, tokenizer: Tokenizer) -> list[Line]:
    """The eligible target lines of one document."""
    encoding = tokenizer.encode(source)
    ids, ends = encoding.ids, [end for _, end in encoding.offsets]
    targets = set(function_body_lines(source))
    lines, start, content_end = [], 0, 0
    for number, text in enumerate(source.split("\n")):
        stripped = text.rstrip()
        if stripped:
            if number in targets and not stripped.lstrip().startswith("#"):
                prompt_tokens = bisect_right(ends, content_end)
                own_tokens = bisect_right(ends, start + len(stripped)) - prompt_tokens
                if prompt_tokens >= PROMPT_TOKENS and own_tokens < MAX_NEW_TOKENS:
                    tail = source[max(0, content_end - EXAMPLE_CHARS) : content_end]
                    lines.append(Line(tokens=ids, start=prompt_tokens, target=stripped, prompt_tail=tail))
            content_end = start + len(stripped)
        start += len(text) + 1
    return lines


def eligible_lines(texts: Iterable[str], tokenizer: Tokenizer, max_bytes: int) -> list[Line]:
    """Every eligible line of the documents, in order, until `max_bytes` of text are read."""
    lines: list[Line] = []
    covered = 0
    for text in texts:
        if covered >= max_bytes:
            break
        covered += len(text.encode())
        lines.extend(_document_lines(text.replace("\r\n", "\n").replace("\r", "\n"), tokenizer))
    return lines


def written_line(completion: str) -> str | None:
    """The first non-blank line the model finished after ending the prompt's line, or None."""
    first, *rest = completion.split("\n")
    if first.strip():  # the model went on with the prompt's line instead of ending it
        return None
    complete = rest[:-1]  # the text after the last newline may be cut short
    return next((line.rstrip() for line in complete if line.strip()), None)


def next_line_exact_match(inputs: EvalInputs) -> Score:
    """Share of sampled function-body lines the model writes exactly, by greedy decoding."""
    lines = eligible_lines(inputs.validation_texts(), inputs.tokenizer, inputs.max_bytes)
    if not lines:
        raise ConfigError(
            f"next_line found no function-body line with {PROMPT_TOKENS} tokens before it in {inputs.max_bytes} bytes "
            "of held-out text: raise eval.max_bytes or data.validation_percent"
        )
    chosen = random.Random(inputs.seed).sample(lines, min(LINES, len(lines)))
    # Room for the whole line within the context when it allows, at least half the context otherwise.
    length = min(PROMPT_TOKENS, max(inputs.context - MAX_NEW_TOKENS, inputs.context // 2))
    sampling = Sampling(new_tokens=MAX_NEW_TOKENS, eos_id=inputs.eos_id)
    done = generate(inputs.model, [line.prompt(length) for line in chosen], sampling, context=inputs.context,
                    batch_size=inputs.batch_size)
    written: list[str | None] = []
    for completion in done:
        # EOS ends the document, so it also ends the line being written.
        text = inputs.tokenizer.decode(list(completion.text_tokens)) + ("\n" if completion.finish == "eos" else "")
        written.append(written_line(text))
    matched = sum(line.target == got for line, got in zip(chosen, written, strict=True))
    examples = [
        {"prompt": line.prompt_tail, "target": line.target, "got": got} for line, got in zip(chosen[:EXAMPLES], written, strict=False)
    ]
    details = {"lines": len(chosen), "matched": matched, "examples": examples}
    return Score(value=matched / len(chosen), count=len(chosen), details=details)
