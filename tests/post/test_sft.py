"""SFT batches: the loss counts completion tokens only; the stream resumes exactly and splits over ranks."""

import pytest
import torch
from torch.nn import functional as F

from factory.config.schema import TokenizerConfig
from factory.data.loader import PAD, LoaderState
from factory.errors import ConfigError
from factory.models.tokenizer import train_tokenizer
from factory.post.format import completion, prompt
from factory.post.sft import encode_examples, sft_batches

ROWS = [
    {"id": f"t{i:02d}", "function": f"def f(x):\n    return x * {i} + {i % 3}\n", "call": f"f({i})", "expected": repr(i * i + i % 3)}
    for i in range(12)
]
EOS = 0


@pytest.fixture(scope="module")
def tokenizer():
    texts = [prompt(r["function"], r["call"]) + completion(r["expected"]) for r in ROWS] * 20
    return train_tokenizer(texts, TokenizerConfig(vocab_size=320, min_frequency=2))


def test_targets_are_the_completion_and_nothing_else(tokenizer):
    examples = encode_examples(ROWS, tokenizer, EOS, context=64)
    batch = next(sft_batches(examples, batch_size=4, seed=1, eos_id=EOS))
    for row in range(4):
        example = next(e for e in examples if (e.id,) == batch.documents[row])
        wanted = tokenizer.encode(completion(ROWS[int(example.id[1:])]["expected"])).ids + [EOS]
        targets = batch.y[row][batch.y[row] != PAD].tolist()
        assert targets == wanted  # exactly the completion and the end of text
        first = example.prompt_tokens - 1
        assert (batch.y[row, :first] == PAD).all()  # no target inside the prompt
        assert batch.x[row, : len(example.ids) - 1].tolist() == list(example.ids[:-1])
    assert batch.global_tokens == int((batch.y != PAD).sum())


def test_the_loss_does_not_see_the_prompt(tokenizer):
    examples = encode_examples(ROWS, tokenizer, EOS, context=64)
    batch = next(sft_batches(examples, batch_size=3, seed=0, eos_id=EOS))
    logits = torch.randn(*batch.x.shape, 320, requires_grad=True)
    F.cross_entropy(logits.view(-1, 320), batch.y.view(-1), ignore_index=PAD).backward()
    touched = logits.grad.abs().sum(dim=-1) > 0
    assert touched.tolist() == (batch.y != PAD).tolist()  # gradients flow from completion positions only


def test_resuming_from_a_position_gives_the_same_batches(tokenizer):
    examples = encode_examples(ROWS, tokenizer, EOS, context=64)
    stream = sft_batches(examples, batch_size=5, seed=3, eos_id=EOS)
    first = [next(stream) for _ in range(6)]  # 30 examples: two epochs and a half, each in its own order
    resumed = sft_batches(examples, batch_size=5, seed=3, eos_id=EOS, state=LoaderState.from_json(first[2].state.to_json()))
    for expected in first[3:]:
        got = next(resumed)
        assert got.documents == expected.documents and torch.equal(got.x, expected.x) and torch.equal(got.y, expected.y)
    seen = [d for b in first for d in b.documents]
    assert sorted(seen[:12]) == sorted(seen[12:24]) == sorted((r["id"],) for r in ROWS)  # each epoch is every example once
    assert seen[:12] != seen[12:24]  # in a fresh order


def test_ranks_split_each_global_batch(tokenizer):
    examples = encode_examples(ROWS, tokenizer, EOS, context=64)
    whole = next(sft_batches(examples, batch_size=4, seed=2, eos_id=EOS))
    halves = [next(sft_batches(examples, batch_size=4, seed=2, eos_id=EOS, rank=r, world=2)) for r in (0, 1)]
    assert halves[0].documents + halves[1].documents == whole.documents
    assert halves[0].global_tokens == whole.global_tokens
    with pytest.raises(ConfigError, match="divisible by the number of ranks"):
        next(sft_batches(examples, batch_size=3, seed=2, eos_id=EOS, world=2))


def test_prompts_keep_their_end_when_too_long(tokenizer):
    examples = encode_examples(ROWS, tokenizer, EOS, context=12)
    assert all(len(e.ids) <= 13 for e in examples)
    full = tokenizer.encode(prompt(ROWS[0]["function"], ROWS[0]["call"])).ids
    assert list(examples[0].ids[: examples[0].prompt_tokens]) == full[-examples[0].prompt_tokens :]
    with pytest.raises(ConfigError, match="raise model.context"):
        encode_examples(ROWS, tokenizer, EOS, context=1)
