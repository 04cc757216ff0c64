"""Bits per byte: exact value for a uniform model, each token scored once, validation token streams."""

import inspect
import math
import textwrap

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from factory.config.schema import TokenizerConfig
from factory.errors import FactoryError
from factory.evals.bpb import bits_per_byte, validation_tokens
from factory.models.tokenizer import EOS, train_tokenizer

V = 11
LENGTHS = [0, 1, 1, 2, 3, 1, 4, 2, 1, 5, 2]  # bytes per token id; id 0 plays EOS
TOKENS = torch.randint(0, V, (37,), generator=torch.Generator().manual_seed(0))


class Uniform(nn.Module):
    """Zero logits: every token has probability 1/V."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self.seen.append(idx.clone())
        return torch.zeros(*idx.shape, V)


class Bigram(nn.Module):
    """Logits depend on the current token only, so windowing cannot change the score."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(V, V)
        nn.init.normal_(self.table.weight, generator=torch.Generator().manual_seed(1))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table(idx)


def test_uniform_model_scores_log2_v_bits_per_scored_token():
    result = bits_per_byte(Uniform(), TOKENS, LENGTHS, context=5, batch_size=2)
    scored = len(TOKENS) - 1
    covered = sum(LENGTHS[t] for t in TOKENS.tolist()[1:])
    assert result.tokens == scored
    assert result.bytes == covered
    assert result.bpb == pytest.approx(scored * math.log2(V) / covered, rel=1e-6)


def test_every_input_position_is_fed_exactly_once_in_order():
    model = Uniform()
    bits_per_byte(model, TOKENS, LENGTHS, context=6, batch_size=4)
    fed = torch.cat([batch.flatten() for batch in model.seen])
    assert len(fed) >= len(TOKENS) - 1
    assert torch.equal(fed[: len(TOKENS) - 1], TOKENS[:-1])
    assert all(batch.shape[1] == 6 and batch.shape[0] <= 4 for batch in model.seen)


def test_bigram_score_matches_an_explicit_sum_whatever_the_windowing():
    model = Bigram()
    with torch.no_grad():
        log_probs = F.log_softmax(model.table.weight.double(), dim=-1)
    pairs = zip(TOKENS.tolist()[:-1], TOKENS.tolist()[1:], strict=True)
    nats = -sum(log_probs[a, b].item() for a, b in pairs)
    covered = sum(LENGTHS[t] for t in TOKENS.tolist()[1:])
    expected = nats / math.log(2) / covered
    results = [bits_per_byte(model, TOKENS, LENGTHS, context, batch) for context in (4, 7) for batch in (1, 3)]
    for result in results:
        assert result.bpb == pytest.approx(expected, rel=1e-5)
        assert (result.tokens, result.bytes) == (len(TOKENS) - 1, covered)


def test_tokens_that_cover_no_bytes_cannot_be_scored():
    with pytest.raises(FactoryError, match="no bytes"):
        bits_per_byte(Uniform(), torch.tensor([3, 0, 0, 0]), LENGTHS, context=4, batch_size=1)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([inspect.getsource(textwrap)], TokenizerConfig(vocab_size=300, min_frequency=1))


def test_validation_tokens_stop_once_max_bytes_are_covered_and_end_each_text_with_eos(tokenizer):
    eos = tokenizer.token_to_id(EOS)
    texts = [f"v_{i}={i}\n" for i in range(10, 30)]  # 8 bytes each
    tokens = validation_tokens(texts, tokenizer, eos, max_bytes=20)
    kept = texts[:3]  # 8, 16, 24: the third text crosses 20 bytes
    expected = [i for text in kept for i in [*tokenizer.encode(text).ids, eos]]
    assert tokens.tolist() == expected
    assert tokens.dtype == torch.int64
    assert tokens[-1].item() == eos
    assert (tokens == eos).sum().item() == len(kept)


def test_validation_tokens_take_every_text_when_the_budget_allows(tokenizer):
    eos = tokenizer.token_to_id(EOS)
    texts = ["def f():\n    pass\n", "é = 'ü'\n"]
    tokens = validation_tokens(texts, tokenizer, eos, max_bytes=10_000)
    assert (tokens == eos).sum().item() == 2
    assert tokenizer.decode(tokens.tolist()) == "".join(texts)


def test_empty_validation_split_is_refused(tokenizer):
    with pytest.raises(FactoryError, match="empty"):
        validation_tokens([], tokenizer, tokenizer.token_to_id(EOS), max_bytes=100)
