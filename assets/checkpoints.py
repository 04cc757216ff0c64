"""The `checkpoints` asset: one partition per saved checkpoint, recorded as the training stage saves it.

Its partitions are `<experiment>__<stage>-<step:06d>`. Nothing computes a checkpoint on its own,
so the asset is declared, not defined: while a training stage runs, its asset watches the stage's
checkpoint directory and reports a materialization for each checkpoint as soon as it is complete,
so evaluations start while training goes on; once the stage publishes, each kept checkpoint is
reported again, pointing into the immutable artifact.
"""

from pathlib import Path

from dagster import AssetExecutionContext, AssetMaterialization, AssetSpec, Failure, MetadataValue

from assets.partitions import BENCHMARKS, CHECKPOINTS, checkpoints_partitions
from factory.config import Experiment, StageSpec
from factory.config.schema import EvalConfig
from factory.config.stages import TRAINING_STAGES
from factory.errors import ConfigError
from factory.evals.benchmarks import benchmark
from factory.podium.links import checkpoint_url
from factory.train.records import SavedCheckpoint, partition_key, published

checkpoints = AssetSpec(
    key=CHECKPOINTS,
    deps=list(TRAINING_STAGES),
    partitions_def=checkpoints_partitions,
    description="Every checkpoint of every training run, as it is saved: step, tokens seen, loss, learning rate, sha256 and size.",
    kinds={"torch"},
    group_name="pipeline",
)


class CheckpointRecorder:
    """Reports the checkpoints of one training stage as `checkpoints` partitions, each once per place it is stored."""

    def __init__(self, context: AssetExecutionContext, experiment: Experiment, spec: StageSpec, git_commit: str) -> None:
        self.context = context
        self.experiment = experiment
        self.spec = spec
        self.git_commit = git_commit
        self.recorded: dict[str, str] = {}
        names = experiment.eval.benchmarks if experiment.eval else ()
        for name in names:  # a typo must not become a partition every later backfill trips over
            try:
                benchmark(name)
            except ConfigError as e:
                raise Failure(description=f"{experiment.name}: eval.benchmarks: {e}") from e
        if new := [name for name in names if not context.instance.has_dynamic_partition(BENCHMARKS, name)]:
            context.instance.add_dynamic_partitions(BENCHMARKS, new)  # before the first checkpoint, so its evaluations are due

    def poll(self, directory: Path) -> None:
        """`record` while the stage runs: a failure to write to Dagster is logged and tried again next time, never fatal."""
        try:
            self.record(directory)
        except Exception as e:  # e.g. "database is locked" while the daemon writes; training must go on
            self.context.log.warning(f"recording checkpoints failed this time, will retry: {e}")

    def record(self, directory: Path, stage_digest: str | None = None) -> list[str]:
        """Report every complete checkpoint in `directory` not yet reported from there; returns the keys in it."""
        saved = published(directory) if directory.is_dir() else []
        keys = [partition_key(self.experiment.name, self.spec.kind, checkpoint.step) for checkpoint in saved]
        new = [key for key in keys if key not in self.recorded and not self.context.instance.has_dynamic_partition(CHECKPOINTS, key)]
        if new:
            self.context.instance.add_dynamic_partitions(CHECKPOINTS, new)
        for key, checkpoint in zip(keys, saved, strict=True):
            if self.recorded.get(key) == str(checkpoint.path):
                continue
            self.recorded[key] = str(checkpoint.path)
            self.context.log_event(AssetMaterialization(asset_key=CHECKPOINTS, partition=key, metadata=self.metadata(checkpoint, stage_digest)))
        return keys

    def forget_deleted(self, kept: list[str]) -> None:
        """Remove the partitions of checkpoints recorded during training that retention deleted since."""
        if gone := sorted(set(self.recorded) - set(kept)):
            for key in gone:
                self.context.instance.delete_dynamic_partition(CHECKPOINTS, key)
            self.context.log.info(f"{len(gone)} checkpoints deleted by the retention policy are no longer partitions: {', '.join(gone)}")

    def metadata(self, checkpoint: SavedCheckpoint, stage_digest: str | None) -> dict:
        """What an evaluation needs to load exactly these bytes, and what a person wants to see."""
        metrics = checkpoint.metrics
        evaluation = self.experiment.eval or EvalConfig()
        return {
            "step": checkpoint.step,
            "tokens_seen": int(metrics.get("tokens_seen", 0)),
            "loss": float(metrics.get("loss", float("nan"))),
            "lr": float(metrics.get("lr", float("nan"))),
            "sha256": checkpoint.sha256,
            "podium": MetadataValue.url(checkpoint_url(checkpoint.sha256)),
            "size_bytes": checkpoint.size,
            "path": MetadataValue.path(str(checkpoint.path)),
            "stored": "artifact" if stage_digest else "training (may be deleted by retention)",
            "stage_digest": stage_digest or "not published yet",
            "experiment": self.experiment.name,
            "git_commit": self.git_commit,
            "training": MetadataValue.json(self.spec.to_json()),
            "eval": MetadataValue.json({"max_bytes": evaluation.max_bytes, "batch_size": evaluation.batch_size}),
        }
