"""Prompts saved from Podium, evaluated: `custom_prompts.v<n>` reads that version and completes every prompt."""

import pytest
import torch

from factory.config.schema import ModelConfig
from factory.data.catalog import CatalogConfig, open_catalog
from factory.errors import ArtifactError
from factory.evals.benchmarks import EvalInputs, benchmark, known
from factory.models.build import new_model
from factory.models.tokenizer import EOS, fetched_tokenizer, load_tokenizer
from factory.podium.generate import Generator, candidates
from factory.data.prompts import save_prompt
from factory.registry import ArtifactStore
from factory.registry.store import manifest_of
from tests.podium.conftest import store  # noqa: F401  (the fixture)


def inputs_for(store, catalog) -> tuple[EvalInputs, Generator]:
    registry = ArtifactStore(store / "registry")
    candidate = sorted(candidates(registry), key=lambda c: c.experiment)[0]
    tokenizer = load_tokenizer(fetched_tokenizer(registry, manifest_of(registry, candidate.tokenizer)))
    model = new_model(ModelConfig.model_validate(candidate.model), tokenizer.get_vocab_size())
    model.load_state_dict(torch.load(registry.fetch(candidate.weights.artifact, candidate.weights.name), weights_only=True)["model"])
    model.eval()
    inputs = EvalInputs(model=model, tokenizer=tokenizer, eos_id=tokenizer.token_to_id(EOS), context=candidate.context,
                        validation_texts=lambda: iter(()), seed=0, batch_size=4, max_bytes=1000, catalog=catalog)
    return inputs, Generator(registry), candidate


def test_a_saved_version_is_a_benchmark_of_its_prompts(store, tmp_path):
    catalog = open_catalog(CatalogConfig.local(tmp_path / "iceberg"))
    save_prompt(catalog, "def add(a, b):\n    return", "stops early")
    save_prompt(catalog, "import os\n", "imports")
    save_prompt(catalog, "class A:\n", "added after v2")
    inputs, generator, candidate = inputs_for(store, catalog)
    assert known("custom_prompts.v2") and not known("custom_prompts.latest")
    score = benchmark("custom_prompts.v2").run(inputs)
    assert score.count == 2, "v2 holds the first two prompts, not the one saved after"
    answers = score.details["completions"]
    assert [a["note"] for a in answers] == ["stops early", "imports"]
    assert score.value == sum(a["python"] for a in answers) / 2
    # The same greedy completion Podium shows for that checkpoint and prompt.
    shown = generator.complete(candidate, "def add(a, b):\n    return", new_tokens=48)
    assert answers[0]["completion"] == shown.text
    with pytest.raises(ArtifactError, match="no version tagged .v9."):
        benchmark("custom_prompts.v9").run(inputs)
