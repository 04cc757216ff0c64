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
