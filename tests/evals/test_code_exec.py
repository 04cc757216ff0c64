"""The code-execution benchmark: exact answers score 1, wrong ones 0, on the pinned test split; a missing task set is said plainly."""

import logging

import pytest
import torch
from torch import nn

from factory.config.schema import TokenizerConfig
from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.tables import write_version
from factory.errors import ConfigError
from factory.evals.benchmarks import EvalInputs
from factory.evals.code_exec import TABLE, code_exec_accuracy, prompt
from factory.models.tokenizer import EOS, train_tokenizer
from factory.post.tasks import TASK_SCHEMA, generate


class Oracle(nn.Module):
    """Knows every task: after a prompt it has seen, it writes the expected answer and a newline, token by token."""

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], vocab: int) -> None:
        super().__init__()
        self.continuations, self.vocab, self.dummy = continuations, vocab, nn.Parameter(torch.zeros(1))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*idx.shape, self.vocab)
        for row, ids in enumerate(idx.tolist()):
            for prefix, answer in self.continuations.items():
                if len(ids) >= len(prefix) and tuple(ids[: len(prefix)]) == prefix and len(ids) - len(prefix) < len(answer):
                    logits[row, -1, answer[len(ids) - len(prefix)]] = 1.0
        return logits


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    catalog = open_catalog(CatalogConfig.local(root))
    tasks = generate(200, 1, seed=0)
    write_version(catalog, TABLE, tasks.rows, logging.getLogger("test"), schema=TASK_SCHEMA)
    texts = [row["function"] + row["call"] + row["expected"] for row in tasks.rows.to_pylist()]
    tokenizer = train_tokenizer(texts * 3, TokenizerConfig(vocab_size=400, sample_bytes=1_000_000))
    return catalog, tokenizer, tasks


def inputs(world, model):
    catalog, tokenizer, _ = world
    return EvalInputs(model=model, tokenizer=tokenizer, eos_id=tokenizer.token_to_id(EOS), context=512, validation_texts=lambda: iter(()),
                      seed=0, batch_size=8, max_bytes=1000, catalog=catalog)


def test_a_model_that_knows_the_answers_scores_one_and_one_that_does_not_scores_zero(world):
    _, tokenizer, tasks = world
    test = [row for row in tasks.rows.to_pylist() if row["split"] == "test"]
    continuations = {tuple(tokenizer.encode(prompt(r["function"], r["call"])).ids): tokenizer.encode(r["expected"] + "\n").ids for r in test}
    vocab = tokenizer.get_vocab_size()
    perfect = code_exec_accuracy(inputs(world, Oracle(continuations, vocab)))
    assert perfect.value == 1.0 and perfect.count == min(64, len(test))
    wrong = {prefix: tokenizer.encode("None\n").ids for prefix in continuations}
    assert code_exec_accuracy(inputs(world, Oracle(wrong, vocab))).value == 0.0


def test_without_the_task_set_the_error_says_what_to_materialize(world, tmp_path):
    empty = open_catalog(CatalogConfig.local(tmp_path))
    _, tokenizer, _ = world
    model = Oracle({}, tokenizer.get_vocab_size())
    with pytest.raises(ConfigError, match="materialize the code_exec_tasks asset first"):
        code_exec_accuracy(EvalInputs(model=model, tokenizer=tokenizer, eos_id=0, context=512, validation_texts=lambda: iter(()), seed=0,
                                      batch_size=8, max_bytes=1000, catalog=empty))
