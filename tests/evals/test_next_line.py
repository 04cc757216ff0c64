"""Next-line exact match: which lines are targets, where prompts end, and scores of known models."""

import inspect
import json
import textwrap

import pytest
import torch
from torch import nn

from factory.config.schema import ModelConfig, TokenizerConfig
from factory.errors import ConfigError
from factory.evals.benchmarks import EvalInputs
from factory.evals.next_line import (
    LINES, MAX_NEW_TOKENS, PROMPT_TOKENS, eligible_lines, function_body_lines, next_line_exact_match, written_line,
)
from factory.models.build import build_model
from factory.models.tokenizer import EOS, train_tokenizer

DOCUMENT = inspect.getsource(textwrap)
HEADER = "# " + " ".join(f"word{i}" for i in range(PROMPT_TOKENS)) + "\n"  # enough tokens before any line
SOURCE = HEADER + '''import os


def f(
    a,
    b,
):
    """Doc."""
    # a comment

    x = a + b
    def g(): return 1
    return x  


class C:
    def m(self):
        return 2

    async def n(self): await self.m()

    def long(self):
        return ''' + " + ".join(f"self.v{i}" for i in range(40)) + "\n"


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([DOCUMENT, inspect.getsource(json)], TokenizerConfig(vocab_size=512, min_frequency=2))


def inputs(tokenizer, model, texts, *, seed=0, context=128, batch_size=16, max_bytes=1_000_000):
    return EvalInputs(
        model=model, tokenizer=tokenizer, eos_id=tokenizer.token_to_id(EOS), context=context,
        validation_texts=lambda: iter(texts), seed=seed, batch_size=batch_size, max_bytes=max_bytes,
    )


class Oracle(nn.Module):
    """Knows one document's tokens: predicts what follows the input there, and EOS at its end."""

    def __init__(self, tokens: list[int], vocab: int, eos: int) -> None:
        super().__init__()
        self.text = "".join(map(chr, tokens))  # one character per token, so str.find searches token sequences
        self.tokens, self.vocab, self.eos = tokens, vocab, eos

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*idx.shape, self.vocab)
        for row, ids in enumerate(idx.tolist()):
            at = self.text.find("".join(map(chr, ids)))
            assert at >= 0, "the oracle is only asked about the document"
            after = at + len(ids)
            logits[row, -1, self.tokens[after] if after < len(self.tokens) else self.eos] = 1.0
        return logits


class AlwaysEos(nn.Module):
    def __init__(self, vocab: int, eos: int) -> None:
        super().__init__()
        self.vocab, self.eos = vocab, eos

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*idx.shape, self.vocab)
        logits[..., self.eos] = 1.0
        return logits


def test_function_body_lines_skip_signatures_and_code_outside_functions():
    source = "import os\n\ndef f(\n    a,\n):\n    x = a\n\n    return x\nclass C:\n    def m(self): return 1\n    y = 2\n"
    assert function_body_lines(source) == [5, 6, 7]
    assert function_body_lines("def f(:\n    pass\n") == []


def test_targets_are_code_lines_of_function_bodies_that_fit_the_token_budget(tokenizer):
    lines = eligible_lines([SOURCE], tokenizer, max_bytes=10_000)
    assert [line.target for line in lines] == ['    """Doc."""', "    x = a + b", "    return x", "        return 2"]
    long = "        return " + " + ".join(f"self.v{i}" for i in range(40))
    assert len(tokenizer.encode(long).ids) >= MAX_NEW_TOKENS  # the last body line is too long to be a target


def test_prompts_are_the_document_tokens_up_to_the_last_character_before_the_line(tokenizer):
    lines = eligible_lines([DOCUMENT], tokenizer, max_bytes=10**6)
    assert len(lines) > LINES
    for line in lines:
        prompt = tokenizer.decode(list(line.tokens[: line.start]))
        assert DOCUMENT.startswith(prompt)
        assert prompt[-1].strip()  # ends on a visible character
        assert DOCUMENT[len(prompt) :].lstrip(" \t").lstrip("\n").startswith(line.target)
        assert prompt.endswith(line.prompt_tail)
        assert line.start >= PROMPT_TOKENS


def test_windows_newlines_are_read_as_newlines(tokenizer):
    unix = eligible_lines([SOURCE], tokenizer, max_bytes=10_000)
    windows = eligible_lines([SOURCE.replace("\n", "\r\n")], tokenizer, max_bytes=10_000)
    assert [line.target for line in windows] == [line.target for line in unix]


def test_documents_are_read_until_max_bytes_are_covered(tokenizer):
    one = eligible_lines([SOURCE, DOCUMENT], tokenizer, max_bytes=1)
    both = eligible_lines([SOURCE, DOCUMENT], tokenizer, max_bytes=len(SOURCE) + 1)
    assert len(one) == 4
    assert len(both) > len(one)


@pytest.mark.parametrize(
    ("completion", "line"),
    [
        ("\n    return x\n", "    return x"),
        ("  \n\n    return x  \n    y", "    return x"),
        ("\n    return x", None),  # not finished within the budget
        (" + 1\n    return x\n", None),  # went on with the prompt's line
        ("\n \n", None),
    ],
)
def test_the_written_line_is_the_first_finished_non_blank_line(completion, line):
    assert written_line(completion) == line


def test_a_model_that_knows_the_document_scores_one_and_an_eos_model_zero(tokenizer):
    eos, vocab = tokenizer.token_to_id(EOS), tokenizer.get_vocab_size()
    knows = Oracle(tokenizer.encode(DOCUMENT).ids, vocab, eos)
    oracle = next_line_exact_match(inputs(tokenizer, knows, [DOCUMENT], batch_size=7))
    assert (oracle.value, oracle.count) == (1.0, LINES)
    assert oracle.details["matched"] == LINES
    assert all(example["got"] == example["target"] for example in oracle.details["examples"])
    silent = next_line_exact_match(inputs(tokenizer, AlwaysEos(vocab, eos), [DOCUMENT]))
    assert (silent.value, silent.count, silent.details["matched"]) == (0.0, LINES, 0)


def test_the_seed_chooses_the_lines(tokenizer):
    model = AlwaysEos(tokenizer.get_vocab_size(), tokenizer.token_to_id(EOS))

    def targets(seed):
        return [e["target"] for e in next_line_exact_match(inputs(tokenizer, model, [DOCUMENT], seed=seed)).details["examples"]]

    assert targets(0) == targets(0)
    assert targets(0) != targets(1)


def test_no_scoreable_line_says_what_to_raise(tokenizer):
    model = AlwaysEos(tokenizer.get_vocab_size(), tokenizer.token_to_id(EOS))
    with pytest.raises(ConfigError, match="max_bytes"):
        next_line_exact_match(inputs(tokenizer, model, ["def f():\n    return 1\n"]))


def test_a_small_gpt_scores_the_same_whatever_the_batch(tokenizer):
    model = build_model(ModelConfig(n_layer=1, n_head=2, n_embd=32, context=64), tokenizer.get_vocab_size(), seed=0)
    first = next_line_exact_match(inputs(tokenizer, model, [DOCUMENT], context=64, batch_size=16))
    second = next_line_exact_match(inputs(tokenizer, model, [DOCUMENT], context=64, batch_size=5))
    assert first == second
    assert first.count == LINES
