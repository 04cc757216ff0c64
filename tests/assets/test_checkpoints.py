"""The `checkpoints` asset hears of a training stage's checkpoints from its Pipes messages, as they are saved and deleted."""

import sys
from pathlib import Path

from dagster import AssetExecutionContext, AssetKey, DagsterInstance, asset, materialize

from assets.checkpoints import CheckpointRecorder
from assets.partitions import CHECKPOINTS
from assets.records import latest_metadata
from factory.config import load, plan_stage, upstream_of
from factory.train.records import partition_key
from resources.launcher import run_with_pipes

STAGE = Path(__file__).with_name("checkpointing_stage.py")


def test_checkpoints_are_recorded_from_messages_while_the_stage_runs_and_deletions_remove_partitions(tmp_path, tiny_path):
    experiment = load(tiny_path)
    spec = plan_stage(experiment, "pretrain", {name: "0" * 64 for name in upstream_of(experiment, "pretrain")})
    first, second = (partition_key(experiment.name, "pretrain", step) for step in (1, 2))
    home = tmp_path / "dagster"
    elsewhere = tmp_path / "the stage's own disk"  # not the stage's work directory: only its messages say what is there

    @asset(name="pretrain")
    def stage(context: AssetExecutionContext):
        recorder = CheckpointRecorder(context, experiment, spec, "0" * 40)
        yield from run_with_pipes(context, [sys.executable, str(STAGE), str(elsewhere), str(home), first, second], "pretrain",
                                  recorder.heard)

    home.mkdir()
    instance = DagsterInstance.local_temp(str(home))
    result = materialize([stage], instance=instance, raise_on_error=False)
    assert result.success  # the stage went on past each checkpoint only once it was recorded (or deleted) here
    assert not elsewhere.exists()
    assert instance.get_dynamic_partitions(CHECKPOINTS) == [second]
    metadata = latest_metadata(instance, CHECKPOINTS, second)
    assert (metadata["step"], metadata["loss"], metadata["tokens_seen"], metadata["path"]) == (2, 2.0, 128, str(elsewhere / "step_000002.pt"))
    assert len(metadata["sha256"]) == 64 and metadata["size_bytes"] > 0
    assert metadata["stored"] == "training (may be deleted by retention)"
    [materialized] = [m for m in result.asset_materializations_for_node("pretrain") if m.asset_key == AssetKey("pretrain")]
    assert materialized.metadata["metrics"].value == [{"step": 1, "loss": 3.0}]  # checkpoint messages are not metrics


def test_a_published_training_in_an_object_store_is_recorded_from_its_records_without_fetching_a_checkpoint(tmp_path, tiny_path, s3_server,
                                                                                                            monkeypatch):
    """A cache hit of a training stage records its kept checkpoints as partitions pointing into the bucket: the small
    records are read, the checkpoints' bytes are not fetched (no local copy), and a backfill counts them as stored."""
    import hashlib
    import json
    import os
    import uuid

    from assets.backfill import stored_checkpoints
    from factory.registry import Provenance
    from factory.registry.objects import ObjectRegistry
    from factory.storage import open_store

    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    registry = ObjectRegistry(open_store(f"s3://{s3_server.bucket}/{uuid.uuid4().hex[:12]}"), tmp_path / "local")
    experiment = load(tiny_path)
    spec = plan_stage(experiment, "pretrain", {name: "0" * 64 for name in upstream_of(experiment, "pretrain")})
    with registry.staging() as out:
        for step in (100, 200):
            weights = os.urandom(4096)
            (out / f"step_{step:06d}.pt").write_bytes(weights)
            (out / f"step_{step:06d}.json").write_text(json.dumps({"step": step, "format": "file", "size": len(weights),
                                                                   "sha256": hashlib.sha256(weights).hexdigest(), "metrics": {"loss": 2.0}}))
        manifest = registry.publish(out, kind="pretrain", fingerprint=spec.fingerprint, config=spec.config, inputs=dict(spec.upstream),
                                    code=spec.code, provenance=Provenance(experiment=experiment.name, config_hash="0" * 16, git_commit="0" * 40),
                                    summary={})

    @asset(name="pretrain")
    def stage(context: AssetExecutionContext) -> None:
        CheckpointRecorder(context, experiment, spec, "0" * 40).record(registry, manifest)

    home = tmp_path / "dagster"
    home.mkdir()
    instance = DagsterInstance.local_temp(str(home))
    assert materialize([stage], instance=instance, raise_on_error=False).success
    keys = [partition_key(experiment.name, "pretrain", step) for step in (100, 200)]
    assert sorted(instance.get_dynamic_partitions(CHECKPOINTS)) == keys
    metadata = latest_metadata(instance, CHECKPOINTS, keys[1])
    assert (metadata["path"], metadata["stored"], metadata["step"]) == (f"{registry.where(manifest.digest)}/step_000200.pt", "artifact", 200)
    assert not [path for path in s3_server.reads() if manifest.digest in path and path.endswith(".pt")]
    assert not (tmp_path / "local" / "cache").exists()
    assert stored_checkpoints(instance, experiment.name) == set(keys)
