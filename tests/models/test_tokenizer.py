"""Byte-level BPE training on real Python source: vocab size, round trips, determinism, byte lengths."""

import inspect
import json
import textwrap

import pytest

from factory.config.schema import TokenizerConfig
from factory.models.tokenizer import EOS, load_tokenizer, sample_texts, token_byte_lengths, train_tokenizer, vocabulary_shortfall

CONFIG = TokenizerConfig(vocab_size=350, min_frequency=1)
NON_ASCII = "def grüße(名前: str) -> str:\n    return f'¡hola {名前}! 🐍 λx → x²'\n"


@pytest.fixture(scope="module")
def texts():
    return [inspect.getsource(json.encoder), inspect.getsource(json.decoder), inspect.getsource(textwrap)]


@pytest.fixture(scope="module")
def tokenizer(texts):
    return train_tokenizer(texts, CONFIG)


def test_training_reaches_the_configured_vocab_size(texts, tokenizer):
    assert sum(len(t.encode()) for t in texts) > 4_000
    assert tokenizer.get_vocab_size() == CONFIG.vocab_size
    assert tokenizer.token_to_id(EOS) is not None


def test_merges_make_python_shorter_than_its_bytes(tokenizer):
    text = inspect.getsource(json.scanner)
    assert len(tokenizer.encode(text).ids) < 0.8 * len(text.encode())


@pytest.mark.parametrize("text", [NON_ASCII, inspect.getsource(json.scanner), "  \t\n\n x = 'ÿ\\x00'\r\n", ""])
def test_decode_inverts_encode(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_training_twice_gives_the_same_tokenizer(texts, tokenizer):
    again = train_tokenizer(texts, CONFIG)
    assert again.to_str() == tokenizer.to_str()


def test_saved_tokenizer_loads_back_identically(tokenizer, tmp_path):
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    loaded = load_tokenizer(path)
    assert loaded.to_str() == tokenizer.to_str()
    assert loaded.encode(NON_ASCII).ids == tokenizer.encode(NON_ASCII).ids


@pytest.mark.parametrize("text", [NON_ASCII, inspect.getsource(json.scanner)])
def test_token_byte_lengths_add_up_to_the_text_bytes(tokenizer, text):
    lengths = token_byte_lengths(tokenizer)
    assert len(lengths) == tokenizer.get_vocab_size()
    ids = tokenizer.encode(text).ids
    assert sum(lengths[i] for i in ids) == len(text.encode())
    assert all(lengths[i] >= 1 for i in ids)


def test_the_end_of_text_token_covers_no_bytes(tokenizer):
    assert token_byte_lengths(tokenizer)[tokenizer.token_to_id(EOS)] == 0


def test_sample_texts_takes_documents_from_the_front():
    docs = [f"doc {i} " * (i + 1) for i in range(40)]
    sample = sample_texts(iter(docs), 500)
    assert sample == docs[: len(sample)]


def test_sample_texts_stops_once_the_byte_budget_is_reached():
    docs = [f"document number {i:03d}\n" * 5 for i in range(100)]  # 105 bytes each
    budget = 1_000
    sample = sample_texts(docs, budget)
    sizes = [len(t.encode()) for t in sample]
    assert sum(sizes) >= budget
    assert sum(sizes[:-1]) < budget  # the last document is the one that crossed the budget
    assert len(set(sample)) == len(sample)
    assert set(sample) <= set(docs)


def test_sample_texts_takes_everything_when_the_budget_exceeds_the_corpus():
    docs = ["a", "bb", "ccc"]
    assert sample_texts(docs, 1_000) == docs


def test_a_vocabulary_short_of_vocab_size_says_to_lower_it_or_add_data(texts):
    config = TokenizerConfig(vocab_size=200_000, min_frequency=2, sample_bytes=1_000_000)
    learned = train_tokenizer(texts, config).get_vocab_size()
    assert learned < config.vocab_size
    assert vocabulary_shortfall(learned, config, 70_000) == (
        f"the tokenizer learned {learned:,} of the 200,000 tokens tokenizer.vocab_size asks for (its sample has no more pairs seen 2+ times); "
        f"lower tokenizer.vocab_size to about {learned:,}, or add data: the train split gave 70,000 of the 1,000,000 bytes tokenizer.sample_bytes asks for"
    )
    assert vocabulary_shortfall(learned, config, 1_000_000).endswith("raise tokenizer.sample_bytes (now 1,000,000) or add datasets")
    assert vocabulary_shortfall(CONFIG.vocab_size, CONFIG, 1_000) is None
