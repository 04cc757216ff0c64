"""Generation sanity: what counts as valid Python, exact counts for a scripted model, seeded samples."""

import inspect
import json
import textwrap

import pytest
import torch
from torch import nn

from factory.config.schema import ModelConfig, TokenizerConfig
from factory.evals.benchmarks import EvalInputs
from factory.evals.sanity import PROMPTS, SAMPLES, python_sanity, valid_sample
from factory.models.build import build_model
from factory.models.tokenizer import EOS, train_tokenizer

# What the scripted model writes after each prompt; the class body is broken.
SCRIPTS = {
    "import os": "\n",
    "from typing import": " Any\n",
    "def main():": "\n    return 0\n",
    "class Config:": "\n    def f(:\n        pass\n",
    "for item in items:": "\n    print(item)\n",
    "with open(path) as f:": "\n    f.read()\n",
    'if __name__ == "__main__":': "\n    main()\n",
    "@dataclass": "\nclass C:\n    x: int = 1\n",
}


@pytest.fixture(scope="module")
def tokenizer():
    sources = [inspect.getsource(module) for module in (textwrap, json)]
    return train_tokenizer(sources, TokenizerConfig(vocab_size=512, min_frequency=2))


def inputs(tokenizer, model, *, seed=0, context=128, batch_size=16):
    return EvalInputs(
        model=model, tokenizer=tokenizer, eos_id=tokenizer.token_to_id(EOS), context=context,
        validation_texts=lambda: iter(()), seed=seed, batch_size=batch_size, max_bytes=1,
    )


class Scripted(nn.Module):
    """Writes its script for whichever prompt the input starts with, then EOS, at any temperature."""

    def __init__(self, tokenizer) -> None:
        super().__init__()
        self.eos, self.vocab = tokenizer.token_to_id(EOS), tokenizer.get_vocab_size()
        self.scripts = [tokenizer.encode(prompt + script).ids + [self.eos] for prompt, script in SCRIPTS.items()]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*idx.shape, self.vocab)
        for row, ids in enumerate(idx.tolist()):
            (script,) = [s for s in self.scripts if s[: len(ids)] == ids[: len(s)]]
            logits[row, -1, script[len(ids)] if len(ids) < len(script) else self.eos] = 1e4
        return logits


@pytest.mark.parametrize(
    ("text", "finished", "valid"),
    [
        ("def f(x):\n    return", False, True),  # judged up to the last newline: an open function
        ("x = [1,\n     2,", False, True),
        ('x = 1\ny = "abc', False, True),  # a string cut by the token budget
        ("import os", False, True),
        ("def f(:\n", False, False),
        ("x = = 1\nnext", False, False),
        ("x = 1\n    y = 2\n", False, False),
        ("def f(x):\n", True, False),  # a finished sample must compile
        ("def f(x):\n    return x\n", True, True),
        ('x = "\\d"\n', True, True),  # invalid escapes only warn
    ],
)
def test_valid_samples_are_python_or_the_start_of_it(text, finished, valid):
    assert valid_sample(text, finished=finished) is valid


def test_prompt_scripts_are_whole_tokens(tokenizer):
    for prompt, script in SCRIPTS.items():
        assert tokenizer.encode(prompt + script).ids[: len(tokenizer.encode(prompt).ids)] == tokenizer.encode(prompt).ids


def test_a_scripted_model_scores_its_share_of_valid_scripts(tokenizer):
    score = python_sanity(inputs(tokenizer, Scripted(tokenizer), batch_size=5))
    broken = SAMPLES // len(PROMPTS)  # every "class Config:" sample
    assert score.count == SAMPLES
    assert score.details["valid"] == SAMPLES - broken
    assert score.value == pytest.approx((SAMPLES - broken) / SAMPLES)
    assert score.details["examples"][0] == {"text": "import os\n", "valid": True}


@pytest.fixture(scope="module")
def gpt(tokenizer):
    return build_model(ModelConfig(n_layer=1, n_head=2, n_embd=32, context=64), tokenizer.get_vocab_size(), seed=0)


def test_a_small_gpt_gives_the_same_samples_for_the_same_seed_whatever_the_batch(tokenizer, gpt):
    first = python_sanity(inputs(tokenizer, gpt, context=64, batch_size=32))
    again = python_sanity(inputs(tokenizer, gpt, context=64, batch_size=3))
    other = python_sanity(inputs(tokenizer, gpt, context=64, batch_size=32, seed=1))
    assert first == again
    assert first.details["examples"] != other.details["examples"]
    assert first.count == SAMPLES
