"""The `evaluation` stage, run as the stage process runs any stage: each partition with its own bytes and settings, nothing
evaluated twice, missing bytes said plainly."""

import hashlib
import logging
from pathlib import Path

import pytest
import torch

from assets.backfill import ranges
from factory.config.schema import ModelConfig, TokenizerConfig
from factory.config.stages import StageSpec
from factory.data.catalog import CatalogConfig, open_catalog
from factory.errors import ArtifactError
from factory.evals.benchmarks import Benchmark, EvalInputs, Score, register
from factory.evals.heldout import write_heldout_corpus
from factory.models.build import build_model
from factory.models.tokenizer import train_tokenizer
from factory.registry import ArtifactStore, Provenance
from factory.registry.layout import BATCH_FILE
from factory.registry.store import Manifest
from factory.runtime.__main__ import run
from factory.runtime.request import StageRequest
from factory.stages.evaluation import CheckpointRef, EvalItem, EvaluationSettings, batch_provenance, batch_spec
from factory.stages.scoring import locate_checkpoint
from tests.conftest import training_settings

MODEL = ModelConfig(n_layer=1, n_head=2, n_embd=32, context=64)
CALLS: list[int] = []


def settings_probe(inputs: EvalInputs) -> Score:
    """Scores a model by its first weight, and says which settings it was given."""
    CALLS.append(inputs.max_bytes)
    return Score(value=float(next(inputs.model.parameters()).detach().flatten()[0]), count=1, details={"max_bytes": inputs.max_bytes})


register(Benchmark(name="settings_probe", version=1, lower_is_better=True, run=settings_probe, description="test only"))


def publish(registry: ArtifactStore, kind: str, files: dict[str, bytes]) -> str:
    with registry.staging() as out:
        for name, data in files.items():
            (out / name).write_bytes(data)
        return registry.publish(out, kind=kind, fingerprint=f"test-{kind}", config={}, inputs={}, code="test",
                                provenance=Provenance(experiment="t", config_hash="t", git_commit="t"), summary={}).digest


@pytest.fixture
def setup(tmp_path):
    registry = ArtifactStore(tmp_path / "registry")
    tokenizer = train_tokenizer([Path(logging.__file__).read_text()], TokenizerConfig(vocab_size=300, sample_bytes=100_000))
    upstream = {"tokenizer": publish(registry, "tokenizer", {"tokenizer.json": tokenizer.to_str().encode()}),
                "blend": publish(registry, "blend", {"blend.json": b'{"parts": [], "validation_percent": 5}'})}
    training = {"kind": "pretrain", "config": training_settings(model=MODEL.model_dump(mode="json"), shuffle_buffer_docs=1),
                "upstream": upstream, "code": "test"}
    path = tmp_path / "step_000001.pt"
    torch.save({"model": build_model(MODEL, tokenizer.get_vocab_size(), seed=1).state_dict()}, path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()

    def item(experiment: str, max_bytes: int = 1000, at: Path = path, trained: dict | None = None) -> EvalItem:
        ref = CheckpointRef(key=f"{experiment}__pretrain-000001", experiment=experiment, step=1, tokens_seen=1, path=str(at), sha256=sha,
                            training=trained or training, eval={"max_bytes": max_bytes, "batch_size": 8}, git_commit="0" * 40)
        return EvalItem(partition=f"settings_probe|{ref.key}", benchmark="settings_probe", checkpoint=ref)

    def request(*items: EvalItem) -> StageRequest:
        spec = batch_spec(items, "test")
        return StageRequest(spec=spec, registry=str(registry.root), catalog=CatalogConfig.local(tmp_path / "iceberg"),
                            provenance=batch_provenance(items, spec.config, "run-1"))

    CALLS.clear()
    return registry, item, request, training


def evaluate(request: StageRequest) -> dict[str, Manifest]:
    """Run the batch as the stage process does; each pair's result, by partition."""
    run(request)
    registry = ArtifactStore(request.registry)
    return {item.partition: registry.lookup(item.fingerprint(request.spec.code)) for item in EvaluationSettings.model_validate(request.spec.config).items}


def test_two_experiments_with_the_same_checkpoint_bytes_get_their_own_settings_and_results(setup):
    registry, item, request, _ = setup
    results = evaluate(request(item("a", max_bytes=1000), item("b", max_bytes=5000)))
    assert sorted(CALLS) == [1000, 5000]
    a, b = results["settings_probe|a__pretrain-000001"], results["settings_probe|b__pretrain-000001"]
    assert (a.summary["experiment"], b.summary["experiment"]) == ("a", "b") and a.fingerprint != b.fingerprint
    assert a.summary["value"] == b.summary["value"]  # the same bytes score the same


def test_each_result_records_the_data_it_was_scored_on(setup, tmp_path):
    registry, item, request, training = setup
    version = write_heldout_corpus(open_catalog(CatalogConfig.local(tmp_path / "iceberg")), logging.getLogger("test"))
    own = item("a")
    shared = EvalItem(partition=f"heldout_bpb|{own.checkpoint.key}", benchmark="heldout_bpb", checkpoint=own.checkpoint)
    results = evaluate(request(own, shared, item("b", max_bytes=5000)))
    blend = training["upstream"]["blend"]
    a, b = results[own.partition].summary["data"], results["settings_probe|b__pretrain-000001"].summary["data"]
    assert a.startswith(f"blend:{blend[:16]}+") and b.startswith(f"blend:{blend[:16]}+")  # the experiment's own held-out split...
    assert a != b  # ...read up to another max_bytes: other bytes
    heldout = results[shared.partition].summary
    assert heldout["data"] == f"eval.heldout_code@v1#{version.content_tag}"  # the pinned table and what it held here
    assert heldout["count"] > 10_000 and heldout["value"] > 0  # a real model scored on every document


def test_an_evaluated_partition_is_never_evaluated_again(setup):
    registry, item, request, _ = setup
    first = evaluate(request(item("a")))
    again = evaluate(request(item("a")))  # the same batch: its artifact is in the registry
    assert CALLS == [1000] and again == first
    [batch] = list(registry.manifests("evaluation"))
    listing = (registry.path(batch.digest) / BATCH_FILE).read_text()
    assert first["settings_probe|a__pretrain-000001"].digest in listing and batch.summary["evaluated"] == 1
    later = evaluate(request(item("a"), item("b", max_bytes=5000)))  # another batch holding the same pair: only the new one is scored
    assert CALLS == [1000, 5000] and later["settings_probe|a__pretrain-000001"] == first["settings_probe|a__pretrain-000001"]
    assert len(list(registry.manifests("evaluation"))) == 2


def test_a_fingerprint_covers_bytes_settings_and_partition_but_not_where_the_file_is(setup, tmp_path):
    _, item, _, _ = setup
    base = item("a").fingerprint("code")
    assert item("a", at=tmp_path / "elsewhere.pt").fingerprint("code") == base
    assert item("a", max_bytes=2000).fingerprint("code") != base
    assert item("b").fingerprint("code") != base
    assert item("a").fingerprint("other code") != base
    # Checkpoints of other trainings (another seed, model or input), each asked right after the one before: their own.
    _, _, _, training = setup
    changes = ({"seed": 2}, {"model": {**training["config"]["model"], "n_embd": 48}})
    others = [{**training, "config": {**training["config"], **change}} for change in changes]
    others.append({**training, "upstream": {**training["upstream"], "blend": "0" * 64}})
    prints = [item("a", trained=other).fingerprint("code") for other in others]
    assert len({base, *prints}) == 4 and item("a").fingerprint("code") == base


def test_what_a_training_puts_in_a_fingerprint_is_read_from_each_spec_exactly_as_it_is(setup):
    """One spec after another, some equal in Python but not in JSON (a dropout of -0.0 is 0.0 to `==`; a seed of 7 and
    7.0 too): what each puts in its checkpoints' evaluation fingerprints is its own, as reading it afresh gives it."""
    from factory.config.fingerprint import canonical_parts
    from factory.stages.evaluation import _trained

    _, item, _, training = setup
    config = training["config"]
    variants = [training, {**training, "config": {**config, "model": {**config["model"], "dropout": -0.0}}},
                {**training, "config": {**config, "seed": 7}}, {**training, "config": {**config, "seed": 7.0}}, training]
    for variant in variants:
        checkpoint = item("a", trained=variant).checkpoint
        settings, spec = checkpoint.settings(), checkpoint.spec
        afresh = {"model": settings.model.model_dump(mode="json"), "seed": settings.seed, "stream": settings.stream.model_dump(mode="json"),
                  "upstream": spec.upstream}
        assert _trained(checkpoint) == canonical_parts(afresh)


def test_deleted_checkpoints_are_named_and_the_others_still_published(setup, tmp_path):
    registry, item, request, _ = setup
    with pytest.raises(ArtifactError, match="could not evaluate 1 checkpoint .1 evaluations done.*retention policy deleted it"):
        evaluate(request(item("a", at=tmp_path / "gone.pt"), item("b")))
    assert [m.summary["experiment"] for m in registry.manifests("evaluations")] == ["b"]
    assert list(registry.manifests("evaluation")) == []  # the batch did not finish: no artifact says it did


def test_a_checkpoint_moved_into_its_published_training_artifact_is_found_there(setup, tmp_path):
    registry, item, _, training = setup
    recorded = item("a", at=tmp_path / "work" / "step_000001.pt")  # the training directory, dropped after publishing
    data = (tmp_path / "step_000001.pt").read_bytes()
    with registry.staging() as out:
        (out / "step_000001.pt").write_bytes(data)
        registry.publish(out, kind="pretrain", fingerprint=StageSpec.from_json(training).fingerprint, config={}, inputs={}, code="test",
                         provenance=Provenance(experiment="a", config_hash="t", git_commit="t"), summary={})
    assert locate_checkpoint(registry, recorded.checkpoint).read_bytes() == data


def test_ranges_are_stretches_of_wanted_checkpoints_in_partition_order_at_most_limit_long():
    order = ["a1", "a2", "b1", "a3", "a4", "a5"]
    assert list(ranges(order, {"a1", "a2", "a3", "a4", "a5"}, limit=2)) == [("a1", "a2"), ("a3", "a4"), ("a5", "a5")]
    assert list(ranges(order, {"a2", "a3"}, limit=50)) == [("a2", "a2"), ("a3", "a3")]
    assert list(ranges(order, set(order), limit=50)) == [("a1", "a5")]
    assert list(ranges(order, set())) == []


def test_a_checkpoint_recorded_in_the_object_store_is_fetched_alone_for_its_evaluation(setup, tmp_path, s3_server, monkeypatch):
    """A `checkpoints` partition of a published training in a store points into the bucket (assets/checkpoints.py):
    the evaluation fetches that checkpoint, checked, and not the training's other checkpoints."""
    import uuid

    from factory.registry.objects import ObjectRegistry
    from factory.storage import open_store

    _, item, _, training = setup
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    registry = ObjectRegistry(open_store(f"s3://{s3_server.bucket}/{uuid.uuid4().hex[:12]}"), tmp_path / "local")
    data = (tmp_path / "step_000001.pt").read_bytes()
    with registry.staging() as out:
        (out / "step_000001.pt").write_bytes(data)
        (out / "step_000002.pt").write_bytes(b"another checkpoint")
        published = registry.publish(out, kind="pretrain", fingerprint=StageSpec.from_json(training).fingerprint, config={}, inputs={},
                                     code="test", provenance=Provenance(experiment="a", config_hash="t", git_commit="t"), summary={})
    recorded = item("a", at=f"{registry.where(published.digest)}/step_000001.pt")
    assert locate_checkpoint(registry, recorded.checkpoint).read_bytes() == data
    assert not [path for path in s3_server.reads() if path.endswith(f"{published.digest}/step_000002.pt")]
