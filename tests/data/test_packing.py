"""Packing documents into one token stream, and sampling training windows from it."""

import inspect
import textwrap

import pytest
import torch

from factory.config.schema import TokenizerConfig
from factory.data.packing import pack_documents, sample_batch
from factory.errors import ConfigError
from factory.models.tokenizer import EOS, train_tokenizer

DOCS = [f"def function_{i}(x):\n    return x + {i}\n" for i in range(12)]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([inspect.getsource(textwrap), *DOCS], TokenizerConfig(vocab_size=300, min_frequency=1))


@pytest.fixture(scope="module")
def eos(tokenizer):
    return tokenizer.token_to_id(EOS)


def split_on(tokens: torch.Tensor, eos: int) -> list[list[int]]:
    pieces, current = [], []
    for token in tokens.tolist():
        if token == eos:
            pieces.append(current)
            current = []
        else:
            current.append(token)
    return pieces + ([current] if current else [])


def test_every_document_appears_once_followed_by_eos(tokenizer, eos):
    packed = pack_documents(iter(DOCS), tokenizer, eos, max_tokens=100_000)
    assert packed.dtype == torch.int64
    assert packed[-1].item() == eos
    assert (packed == eos).sum().item() == len(DOCS)
    decoded = [tokenizer.decode(piece) for piece in split_on(packed, eos)]
    assert sorted(decoded) == sorted(DOCS)
    assert len(packed) == sum(len(tokenizer.encode(d).ids) + 1 for d in DOCS)


def test_documents_keep_the_order_given(tokenizer, eos):
    packed = pack_documents(reversed(DOCS), tokenizer, eos, max_tokens=100_000)
    decoded = [tokenizer.decode(piece) for piece in split_on(packed, eos)]
    assert decoded == list(reversed(DOCS))


def test_reads_no_further_than_it_needs(tokenizer, eos):
    consumed = []

    def stream():
        for doc in DOCS * 1000:
            consumed.append(doc)
            yield doc

    pack_documents(stream(), tokenizer, eos, max_tokens=50)
    assert len(consumed) < len(DOCS) * 1000


def test_truncates_to_max_tokens(tokenizer, eos):
    full = pack_documents(DOCS, tokenizer, eos, max_tokens=100_000)
    short = pack_documents(DOCS, tokenizer, eos, max_tokens=25)
    assert len(full) > 25
    assert len(short) == 25
    assert torch.equal(short, full[:25])


def test_nothing_to_pack_is_an_error(tokenizer, eos):
    with pytest.raises(ConfigError, match="no documents"):
        pack_documents([], tokenizer, eos, max_tokens=10)


def test_targets_are_the_inputs_shifted_by_one():
    tokens = torch.arange(100, dtype=torch.int64)
    x, y = sample_batch(tokens, batch_size=6, context=8, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (6, 8)
    assert torch.equal(y, x + 1)  # tokens[i] == i, so the next token is i + 1
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert int(y.max()) < len(tokens)


def test_batches_are_reproducible_from_the_generator_seed():
    tokens = torch.randint(0, 50, (500,), generator=torch.Generator().manual_seed(9))
    a = sample_batch(tokens, 4, 16, torch.Generator().manual_seed(42))
    b = sample_batch(tokens, 4, 16, torch.Generator().manual_seed(42))
    c = sample_batch(tokens, 4, 16, torch.Generator().manual_seed(43))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_every_window_of_the_stream_can_be_drawn():
    # Windows (x, y) of context 8 fit at starts 0 and 1 of a 10-token stream; both must be drawable,
    # otherwise the last token of every stream is never a training target.
    tokens = torch.arange(10, dtype=torch.int64)
    x, _ = sample_batch(tokens, batch_size=64, context=8, generator=torch.Generator().manual_seed(0))
    assert sorted(set(x[:, 0].tolist())) == [0, 1]
