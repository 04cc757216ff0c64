"""The shared held-out corpus and heldout_bpb: the same bytes on every machine, every document scored, a clear error without it."""

import logging

import pytest

from factory.config.schema import ModelConfig, TokenizerConfig
from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.tables import content_of
from factory.errors import ArtifactError
from factory.evals.benchmarks import EvalInputs, benchmark
from factory.evals.heldout import REF, TABLE, heldout_texts, write_heldout_corpus
from factory.models.build import build_model
from factory.models.tokenizer import EOS, token_byte_lengths, train_tokenizer
from factory.post.tasks import split_of

LOG = logging.getLogger("test")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    catalog = open_catalog(CatalogConfig.local(tmp_path_factory.mktemp("heldout")))
    return catalog, write_heldout_corpus(catalog, LOG)


def inputs(catalog, tokenizer, seed: int) -> EvalInputs:
    model = build_model(ModelConfig(n_layer=1, n_head=2, n_embd=32, context=64), tokenizer.get_vocab_size(), seed=seed)
    model.eval()
    return EvalInputs(model=model, tokenizer=tokenizer, eos_id=tokenizer.token_to_id(EOS), context=64, validation_texts=lambda: iter(()),
                      seed=0, batch_size=8, max_bytes=10, catalog=catalog)


def test_the_corpus_is_the_same_bytes_wherever_it_is_generated_and_holds_test_split_functions_only(corpus, tmp_path):
    catalog, version = corpus
    elsewhere = write_heldout_corpus(open_catalog(CatalogConfig.local(tmp_path)), LOG)
    assert version.ref == REF == f"{TABLE}@v1"
    assert elsewhere.content_tag == version.content_tag and elsewhere.rows == version.rows
    assert write_heldout_corpus(catalog, LOG).snapshot_id == version.snapshot_id  # written again: the same version
    assert content_of(catalog, REF) == version.content_tag
    texts = heldout_texts(catalog)
    assert len(texts) == version.rows >= 100 and len(set(texts)) == len(texts)
    assert all(split_of(text) == "test" for text in texts)  # never in the task set's train split, which fine-tuning reads


def test_heldout_bpb_scores_a_real_model_on_every_document(corpus):
    catalog, version = corpus
    texts = heldout_texts(catalog)
    tokenizer = train_tokenizer(texts, TokenizerConfig(vocab_size=300, sample_bytes=100_000))
    heldout = benchmark("heldout_bpb")
    score = heldout.run(inputs(catalog, tokenizer, seed=1))
    first_token = tokenizer.encode(texts[0]).ids[0]
    assert score.details["documents"] == version.rows
    assert score.count == version.bytes - token_byte_lengths(tokenizer)[first_token]  # every byte but the first token's is scored
    assert 0 < score.value < 20
    assert heldout.run(inputs(catalog, tokenizer, seed=1)).value == score.value  # deterministic
    assert heldout.run(inputs(catalog, tokenizer, seed=2)).value != score.value  # and it depends on the model
    assert heldout.data == REF and heldout.lower_is_better


def test_without_the_corpus_the_error_says_what_to_materialize(corpus, tmp_path):
    catalog, _ = corpus
    tokenizer = train_tokenizer(heldout_texts(catalog)[:20], TokenizerConfig(vocab_size=300, sample_bytes=100_000))
    empty = open_catalog(CatalogConfig.local(tmp_path))
    with pytest.raises(ArtifactError, match="materialize the heldout_corpus asset"):
        benchmark("heldout_bpb").run(inputs(empty, tokenizer, seed=1))
