"""The walking skeleton end to end: tiny-code-lm through Dagster on a persistent sqlite instance."""

import json
import subprocess
from pathlib import Path

import pytest
import torch
from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance

from assets.execution import failure_messages
from assets.run import run_experiment
from factory.config import config_hash, load
from factory.config.stages import stages_of
from factory.data.catalog import CatalogConfig
from factory.podium.links import DEFAULT_URL, checkpoint_url, table_url
from factory.registry import ArtifactStore
from factory.evals.publish import latest_board
from tests.e2e.conftest import objects_but_reports
from tests.forked import factory_command

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
TINY_STAGES = stages_of(load(REPO / "experiments" / "tiny-code-lm.md"))  # no sft, no rl
ALL_ASSETS = (*TINY_STAGES, "leaderboard")
NO_TELEMETRY = {"telemetry": {"enabled": False}}


def materializations(instance: DagsterInstance, asset: str, partition: str | None) -> list:
    """Every materialization of one asset (partition), newest first."""
    partitions = [partition] if partition else None
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=partitions), limit=100).records
    return [record.asset_materialization for record in records]


def metadata_of(materialization) -> dict:
    return {key: value.value for key, value in materialization.metadata.items()}


def scores(pipeline, benchmark: str, root: Path | None = None) -> dict[int, float]:
    """Step -> newest score of the experiment's checkpoints on one benchmark, from the registry."""
    from factory.evals.leaderboard import latest_results

    results = latest_results(ArtifactStore((root or pipeline["root"]) / "registry").manifests("evaluations"))
    return {m.summary["step"]: m.summary["value"] for m in results if m.summary["benchmark"] == benchmark}


def test_every_kept_checkpoint_is_evaluated_and_training_helped(pipeline):
    from dataclasses import replace

    from factory.evals.suite import VAL_BPB
    from factory.models.build import build_model
    from factory.stages.evaluation import CheckpointRef
    from factory.stages.scoring import load_inputs

    bpb = scores(pipeline, "val_bpb")
    assert sorted(bpb) == [100, 200, 300] and sorted(scores(pipeline, "next_line")) == [100, 200, 300]
    assert sorted(scores(pipeline, "heldout_bpb")) == [100, 200, 300]  # its corpus generated on first use
    assert bpb[300] < bpb[100], bpb
    # The untrained initialisation of the same seed, scored by the same benchmark on the same bytes, is far worse.
    key = f"{pipeline['name']}__pretrain-000300"
    [latest, *_] = materializations(pipeline["instance"], "checkpoints", key)
    fields = {k: v for k, v in metadata_of(latest).items() if k in CheckpointRef.model_fields}
    inputs = load_inputs(ArtifactStore(pipeline["root"] / "registry"), CatalogConfig.local(pipeline["root"] / "iceberg"), CheckpointRef(key=key, **fields))
    untrained = build_model(inputs.model.config, inputs.model.vocab_size, load(pipeline["source"]).seed).eval()
    assert bpb[300] < 0.8 * VAL_BPB.run(replace(inputs, model=untrained)).value


def test_an_evaluation_loads_exactly_the_bytes_its_checkpoint_partition_recorded(pipeline, tmp_path):
    from factory.errors import ArtifactError
    from factory.stages.evaluation import CheckpointRef
    from factory.stages.scoring import load_inputs

    key = f"{pipeline['name']}__pretrain-000300"
    [latest, *_] = materializations(pipeline["instance"], "checkpoints", key)
    fields = {k: v for k, v in metadata_of(latest).items() if k in CheckpointRef.model_fields}
    impostor = tmp_path / "step_000300.pt"
    recorded = Path(fields["path"]).read_bytes()
    impostor.write_bytes(recorded[:-1] + bytes([recorded[-1] ^ 1]))  # one bit flipped
    registry, catalog = ArtifactStore(pipeline["root"] / "registry"), CatalogConfig.local(pipeline["root"] / "iceberg")
    with pytest.raises(ArtifactError, match="does not match the sha256"):
        load_inputs(registry, catalog, CheckpointRef(key=key, **{**fields, "path": str(impostor)}))
    with pytest.raises(ArtifactError, match="retention policy"):
        load_inputs(registry, catalog, CheckpointRef(key=key, **{**fields, "path": str(tmp_path / "gone.pt")}))


def test_every_asset_records_commit_config_hash_and_digest(pipeline):
    recipe_hash = config_hash(load(pipeline["source"]))
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    for asset in ALL_ASSETS:
        partition = None if asset == "leaderboard" else pipeline["name"]
        found = materializations(pipeline["instance"], asset, partition)
        assert found, f"{asset} was never materialized"
        for materialization in found:
            metadata = metadata_of(materialization)
            assert metadata["git_commit"].startswith(head or "unknown"), (asset, metadata["git_commit"])
            assert metadata["config_hash"] == (recipe_hash if asset != "leaderboard" else metadata["config_hash"]), asset
            assert metadata["digest"] == materialization.tags["dagster/data_version"], asset
            assert Path(metadata.get("artifact", ArtifactStore(pipeline["root"] / "registry").path(metadata["digest"]))).is_dir()


def test_second_run_reuses_every_artifact(pipeline):
    registry = ArtifactStore(pipeline["root"] / "registry")
    for asset in TINY_STAGES:
        second, first = materializations(pipeline["instance"], asset, pipeline["name"])[:2]
        assert metadata_of(first)["cache"] == "miss", asset
        assert metadata_of(second)["cache"] == "hit", asset
        assert metadata_of(second)["digest"] == metadata_of(first)["digest"], asset
        assert registry.lookup(metadata_of(second)["fingerprint"]) is not None, asset
    assert objects_but_reports(registry) == pipeline["objects_after_first"]


def test_lineage_is_recorded_in_manifests(pipeline):
    registry = ArtifactStore(pipeline["root"] / "registry")
    by_kind = {m.kind: m for m in registry.manifests()}
    digest = {kind: manifest.digest for kind, manifest in by_kind.items()}
    assert by_kind["raw_datasets"].inputs == {}
    assert by_kind["deduped_datasets"].inputs == {"raw_datasets": digest["raw_datasets"]}
    assert by_kind["filtered_datasets"].inputs == {"deduped_datasets": digest["deduped_datasets"]}
    assert by_kind["blend"].inputs == {"filtered_datasets": digest["filtered_datasets"]}
    assert by_kind["tokenizer"].inputs == {"blend": digest["blend"]}
    assert by_kind["pretrain"].inputs == {"blend": digest["blend"], "tokenizer": digest["tokenizer"]}
    assert by_kind["model"].inputs == {"pretrain": digest["pretrain"], "tokenizer": digest["tokenizer"]}
    assert by_kind["evaluations"].inputs == {"blend": digest["blend"], "tokenizer": digest["tokenizer"]}


def test_leaderboard_lists_the_experiment_at_the_model_it_exported(pipeline):
    registry = ArtifactStore(pipeline["root"] / "registry")
    board = latest_board(registry)
    [row] = board.rows
    heldout = scores(pipeline, "heldout_bpb")
    [model] = [m for m in registry.manifests("model") if m.experiment == pipeline["name"]]
    assert board.sort == "heldout_bpb" and row.ranked and row.finished  # the primary benchmark: the data every experiment shares
    assert row.experiment == pipeline["name"] and row.checkpoint == f"{pipeline['name']}__pretrain-000300" and row.model == model.digest
    assert row.scores["heldout_bpb"] == heldout[300] and row.tracker_url.startswith("mlflow run ")
    assert row.data["heldout_bpb"].startswith("eval.heldout_code@v1#content-") and row.data["val_bpb"].startswith("blend:")
    [latest, *_] = materializations(pipeline["instance"], "leaderboard", None)
    assert f"| 1 | {pipeline['name']} |" in metadata_of(latest)["leaderboard"]
    [best_model, *_] = materializations(pipeline["instance"], "best_model", None)
    assert metadata_of(best_model)["checkpoint"] == row.checkpoint


def run_variant(tmp_path, tiny_path, front_matter: str):
    """Run a small file that extends tiny-code-lm on a fresh root; returns (result, root)."""
    path = tmp_path / "experiments" / "variant.md"
    path.parent.mkdir()
    path.write_text(f"---\nextends: {tiny_path}\n{front_matter}---\nA variant made to fail.\n")
    root = tmp_path / "state"
    (tmp_path / "dagster").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "dagster"), overrides=NO_TELEMETRY)
    return run_experiment(path, root, instance, quiet=True), root


def test_a_failing_stage_reports_its_cause_and_publishes_nothing(tmp_path, tiny_path):
    missing = tmp_path / "no-such-dir"
    result, root = run_variant(tmp_path, tiny_path, f"data:\n  datasets:\n    stdlib:\n      source: {{kind: directory, path: {missing}}}\n")
    assert not result.success
    [message] = failure_messages(result)
    assert message.startswith("raw_datasets:") and "source.path" in message and str(missing) in message
    assert list(ArtifactStore(root / "registry").manifests()) == []


def test_a_failed_dataset_check_blocks_training(tmp_path, tiny_path):
    filters = "      filters: {min_bytes: 100000000}\n"  # every file goes (read from a slice of the sources: quicker, as empty)
    stdlib, site_packages = "      source: {include: ['json/**/*.py']}\n", "      source: {include: ['click/**/*.py']}\n"
    result, root = run_variant(tmp_path, tiny_path, f"data:\n  datasets:\n    stdlib:\n{stdlib}{filters}    site_packages:\n{site_packages}{filters}")
    assert not result.success
    evaluations = [e.event_specific_data for e in result.all_events if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION]
    checks = {evaluation.check_name: evaluation for evaluation in evaluations}
    assert not checks["non_empty"].passed and checks["schema"].passed
    assert "filtered.stdlib" in checks["non_empty"].description and "loosen the filters" in checks["non_empty"].description
    kinds = {m.kind for m in ArtifactStore(root / "registry").manifests()}
    assert kinds == {"raw_datasets", "deduped_datasets", "filtered_datasets"}, "nothing downstream of a failed check may run"
    assert any("non_empty" in message for message in failure_messages(result)), failure_messages(result)
    # Nor may a model of this experiment be promoted: its blocking checks did not all pass.
    from assets.promote import blocking_checks

    summary, failed = blocking_checks(DagsterInstance.local_temp(str(tmp_path / "dagster"), overrides=NO_TELEMETRY), "variant")
    assert summary == "2 of 3 blocking checks passed"
    assert failed == ["filtered_datasets check non_empty is failed for variant at its latest evaluation"]


def test_dataset_assets_record_versions_rows_and_removals(pipeline):
    [raw, *_] = materializations(pipeline["instance"], "raw_datasets", pipeline["name"])
    [deduped, *_] = materializations(pipeline["instance"], "deduped_datasets", pipeline["name"])
    [filtered, *_] = materializations(pipeline["instance"], "filtered_datasets", pipeline["name"])
    raw, deduped, filtered = metadata_of(raw), metadata_of(deduped), metadata_of(filtered)
    for name in ("stdlib", "site_packages"):
        assert raw[f"summary/{name}/table"] == f"raw.{name}@v1"
        assert deduped[f"summary/{name}/rows_in"] == raw[f"summary/{name}/rows"]
        assert deduped[f"summary/{name}/rows_out"] == deduped[f"summary/{name}/rows"] <= raw[f"summary/{name}/rows"]
        assert filtered[f"summary/{name}/rows_in"] == deduped[f"summary/{name}/rows"]
        removed = sum(v for k, v in filtered.items() if k.startswith(f"summary/{name}/removed_"))
        assert filtered[f"summary/{name}/rows_out"] == filtered[f"summary/{name}/rows_in"] - removed
        assert isinstance(filtered[f"summary/{name}/snapshot_id"], int)
        assert raw[f"podium/{name}"] == table_url(f"raw.{name}", "v1")
    assert deduped["summary/stdlib/exact_removed"] > 0, "the standard library holds byte-identical files"


def test_podium_links_in_the_metadata_open_the_table_and_the_checkpoint(pipeline):
    from starlette.testclient import TestClient

    from factory.podium.app import create_app

    client = TestClient(create_app(pipeline["root"]), base_url=DEFAULT_URL, headers={"origin": DEFAULT_URL})
    [filtered, *_] = materializations(pipeline["instance"], "filtered_datasets", pipeline["name"])
    link = metadata_of(filtered)["podium/stdlib"]
    page = client.get(link.removeprefix(DEFAULT_URL))
    assert page.status_code == 200 and "filtered.stdlib" in page.text and "rows 1–50 of" in page.text
    key = sorted(k for k in pipeline["instance"].get_dynamic_partitions("checkpoints") if k.startswith(pipeline["name"]))[-1]
    [checkpoint, *_] = materializations(pipeline["instance"], "checkpoints", key)
    sha = metadata_of(checkpoint)["sha256"]
    assert metadata_of(checkpoint)["podium"] == checkpoint_url(sha)
    chosen = client.get(checkpoint_url(sha).removeprefix(DEFAULT_URL))
    assert chosen.status_code == 200 and f'value="{sha}" checked' in chosen.text
    completion = client.post("/generate", data={"ckpt": sha, "prompt": "def main():\n", "new_tokens": "16"})
    assert completion.status_code == 200 and completion.text.count('class="completion"') == 1


def test_a_fetched_batch_is_the_batch_training_consumed(pipeline):
    from factory.data.catalog import CatalogConfig, open_catalog
    from factory.data.loader import PAD
    from factory.ops.batch import fetch_batch, stage_manifests

    experiment = load(pipeline["source"])
    registry = ArtifactStore(pipeline["root"] / "registry")
    catalog = open_catalog(CatalogConfig.local(pipeline["root"] / "iceberg"))
    step = 57  # between two recorded positions (every 25 steps): replayed from step 50
    fetched = fetch_batch(experiment, step, registry, catalog)
    assert len(fetched) == experiment.pretrain.batch_size
    assert all(d["path"] and d["table"].startswith("filtered.") for s in fetched for d in s.documents)
    # The same batch by brute force: every batch from the very start of the stream.
    from itertools import islice

    from factory.data.blend import Blend
    from factory.config.schema import StreamSettings
    from factory.data.loader import build_loader
    from factory.models.tokenizer import EOS, load_tokenizer

    digests = {kind: manifest.digest for kind, manifest in stage_manifests(experiment, registry, "pretrain").items()}
    blend = Blend.from_json(json.loads((registry.open(digests["blend"]) / "blend.json").read_text()))
    tokenizer = load_tokenizer(registry.open(digests["tokenizer"]) / "tokenizer.json")
    stream = StreamSettings.of(experiment.data)
    loader = build_loader(catalog, blend, tokenizer, tokenizer.token_to_id(EOS), experiment.model.context, experiment.seed, stream)
    [batch] = islice(loader.batches(experiment.pretrain.batch_size), step, step + 1)
    for sequence, x, y in zip(fetched, batch.x, batch.y, strict=True):
        expected = [*x.tolist(), y[-1].item()]
        assert sequence.tokens == [t for t in expected[: sequence.real_tokens + 1]]
    run = json.loads((registry.open(digests["pretrain"]) / "run.json").read_text())
    assert run["final"] == f"step_{experiment.pretrain.steps:06d}.pt" and run["final"] in run["checkpoints"]
    final = torch.load(registry.open(digests["pretrain"]) / run["final"], weights_only=True)
    [last] = islice(loader.batches(experiment.pretrain.batch_size), experiment.pretrain.steps - 1, experiment.pretrain.steps)
    assert final["data_position"] == last.state.to_json()
    assert PAD not in fetched[0].tokens


def test_every_kept_checkpoint_is_a_checkpoints_partition(pipeline):
    from factory.train.records import published

    instance, name = pipeline["instance"], pipeline["name"]
    [training, *_] = materializations(instance, "pretrain", name)
    artifact = Path(metadata_of(training)["artifact"])
    kept = published(artifact)
    assert kept and kept[-1].step == load(pipeline["source"]).pretrain.steps
    keys = [f"{name}__pretrain-{c.step:06d}" for c in kept]
    assert set(keys) <= set(instance.get_dynamic_partitions("checkpoints"))
    for key, checkpoint in zip(keys, kept, strict=True):
        [latest, *_] = materializations(instance, "checkpoints", key)
        metadata = metadata_of(latest)
        assert metadata["step"] == checkpoint.step and metadata["sha256"] == checkpoint.sha256
        assert metadata["size_bytes"] == (artifact / checkpoint.name).stat().st_size
        assert metadata["tokens_seen"] > 0 and metadata["loss"] > 0
        assert metadata["podium"] == checkpoint_url(checkpoint.sha256)


def test_the_model_is_also_exported_as_safetensors_by_gpt2_names(pipeline):
    from safetensors.torch import load_file

    from factory.config.schema import ModelConfig
    from factory.models.hf_layout import gpt2_layout

    [latest, *_] = materializations(pipeline["instance"], "model", pipeline["name"])
    artifact = Path(metadata_of(latest)["artifact"])
    exported = load_file(artifact / "model.safetensors")
    weights = torch.load(artifact / "model.pt", weights_only=True)
    config = json.loads((artifact / "config.json").read_text())
    assert config["architectures"] == ["GPT2LMHeadModel"]
    layout = gpt2_layout(ModelConfig.model_validate(config["model"]), weights, config["vocab_size"])
    assert "lm_head.weight" not in exported, "the tied projection is stored once"
    assert exported.keys() == layout.tensors.keys()
    for name, tensor in exported.items():
        assert torch.equal(tensor, layout.tensors[name]), name


def test_factory_data_batch_from_the_command_line(pipeline):
    """The CLI finds the run's artifacts: the stage fingerprints it computes are those the run computed."""
    result = factory_command("data", "batch", str(pipeline["source"]), "57", "--root", str(pipeline["root"]), "--json", cwd=Path("/"), timeout_s=300)
    assert result.returncode == 0, result.stderr
    batch = json.loads(result.stdout)
    assert batch["step"] == 57 and len(batch["sequences"]) == load(pipeline["source"]).pretrain.batch_size
    assert all(d["table"].startswith("filtered.") for s in batch["sequences"] for d in s["documents"])


def test_training_is_tracked_in_mlflow_and_the_run_is_on_the_materialization(pipeline):
    from mlflow.tracking import MlflowClient

    materialized = [metadata_of(m) for m in materializations(pipeline["instance"], "pretrain", pipeline["name"])]
    computed = next(m for m in materialized if m["cache"] == "miss")
    run_id = computed["summary/tracker_run"]
    assert run_id and run_id in computed["summary/tracker_url"]
    client = MlflowClient(tracking_uri=f"sqlite:///{pipeline['root'] / 'mlflow' / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["fingerprint"] == computed["fingerprint"]
    assert run.data.params["pretrain.lr"] == str(load(pipeline["source"]).pretrain.lr)
    losses = client.get_metric_history(run_id, "loss")
    assert [m.step for m in losses] == list(range(25, 301, 25))
    assert {"tokens_per_second", "step_seconds", "grad_norm", "lr"} <= set(run.data.metrics)


def test_checkpoints_are_recorded_while_training_runs(pipeline):
    """Each checkpoint partition is materialized from the training directory before the stage finishes, then from the artifact."""
    instance, name = pipeline["instance"], pipeline["name"]
    finished = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey("pretrain"), asset_partitions=[name]), limit=100).records[-1]
    assert metadata_of(finished.asset_materialization)["cache"] == "miss"  # the first run, which trained
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey("checkpoints"), asset_partitions=[f"{name}__pretrain-000100"]), limit=100).records
    live = [r for r in records if metadata_of(r.asset_materialization)["stored"].startswith("training")]
    assert live and all(r.timestamp < finished.timestamp for r in live)
    assert "/registry/work/" in metadata_of(live[-1].asset_materialization)["path"]


def test_the_run_report_shows_curves_evaluations_decisions_cost_and_lineage(pipeline):
    from matplotlib.image import imread

    [latest, *_] = materializations(pipeline["instance"], "run_report", pipeline["name"])
    page = Path(metadata_of(latest)["report"])
    text = page.read_text()
    assert text.count("data:image/png;base64,") == 4  # training loss, heldout_bpb, val_bpb, next_line
    assert "<h3>val_bpb (own split) (lower is better)</h3>" in text and "<h3>heldout_bpb (lower is better)</h3>" in text
    for name in ("training.png", "heldout_bpb.png", "val_bpb.png", "next_line.png"):
        image = imread(page.parent / name)
        assert image.shape[:2] == (400, 800) and image.std() > 0.05, name  # a drawn plot, not a blank canvas
    assert "tiny-code-lm: the smallest model" in text  # the reasoning from the file's body
    assert f"{pipeline['name']}__pretrain-000300" in text
    assert "7 of 7 hits" in text  # the newest report describes the second run, where every stage was a cache hit
    assert f"run report of {pipeline['name']}: {page}" in pipeline["second_run_stderr"]  # where to look, said by the run


def test_backfilling_a_new_benchmark_evaluates_every_checkpoint_in_one_run(pipeline, pipeline_copy):
    root = pipeline_copy  # the shared pipeline's stores stay as the other tests expect them
    result = factory_command("evals", "backfill", "--benchmark", "python_sanity", "--root", str(root), cwd=REPO, timeout_s=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "python_sanity: 3 checkpoints evaluated in 1 run of up to 50 partitions" in result.stdout
    assert sorted(scores(pipeline, "python_sanity", root)) == [100, 200, 300]
    keys = DagsterInstance.from_config(str(root / "dagster")).get_materialized_partitions(AssetKey("evaluations"))
    assert {f"python_sanity|{pipeline['name']}__pretrain-{step:06d}" for step in (100, 200, 300)} <= keys
    board = factory_command("leaderboard", "--root", str(root), "--json", cwd=REPO, timeout_s=300)
    assert board.returncode == 0 and set(json.loads(board.stdout)["benchmarks"]) == {"heldout_bpb", "val_bpb", "next_line", "python_sanity"}
    unknown = factory_command("evals", "backfill", "--benchmark", "no_such_benchmark", "--root", str(root), cwd=REPO)
    assert unknown.returncode == 2 and "unknown benchmark 'no_such_benchmark'; registered:" in unknown.stderr
