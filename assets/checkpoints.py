"""The `checkpoints` asset: one partition per saved checkpoint, recorded as the training stage saves it.

Its partitions are `<experiment>__<stage>-<step:06d>`. Nothing computes a checkpoint on its own,
so the asset is declared, not defined: while a training stage runs, the stage sends a Pipes message
for each checkpoint it saves (once complete) and each one retention deletes, and its asset turns
them into a materialization or a deleted partition as they arrive, so evaluations start while
training goes on, wherever the stage runs: nothing reads its disk. Once the stage publishes, each
kept checkpoint is reported again, pointing into the immutable artifact (its prefix in the object store, when the
registry is in one: recording reads the checkpoints' small records, never their bytes).
"""

import threading
from pathlib import Path
from typing import Any

from dagster import AssetExecutionContext, AssetMaterialization, AssetSpec, Failure, MetadataValue

from assets.partitions import BENCHMARKS, CHECKPOINTS, checkpoints_partitions
from factory.config import Experiment, StageSpec
from factory.config.schema import EvalConfig
from factory.config.stages import TRAINING_STAGES
from factory.errors import ConfigError
from factory.evals.benchmarks import benchmark
from factory.podium.links import checkpoint_url
from factory.registry import Manifest, Registry
from factory.train.records import SAVED, CheckpointEvent, SavedCheckpoint, kept_in, partition_key, read_checkpoint_message

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
        self.pending: list[CheckpointEvent] = []
        self.lock = threading.Lock()  # messages arrive on the Pipes reader's thread
        names = experiment.eval.benchmarks if experiment.eval else ()
        for name in names:  # a typo must not become a partition every later backfill trips over
            try:
                benchmark(name)
            except ConfigError as e:
                raise Failure(description=f"{experiment.name}: eval.benchmarks: {e}") from e
        if new := [name for name in names if not context.instance.has_dynamic_partition(BENCHMARKS, name)]:
            context.instance.add_dynamic_partitions(BENCHMARKS, new)  # before the first checkpoint, so its evaluations are due

    def heard(self, message: Any) -> bool:
        """Record a checkpoint message of the running stage as it arrives; False for a message of another kind.

        A failure to write to Dagster is logged and tried again with the next message, never fatal (what is still
        pending at the end is recorded by `record`).
        """
        event = read_checkpoint_message(message)
        if event is None:
            return False
        with self.lock:
            self.pending.append(event)
            try:
                while self.pending:
                    self.apply(self.pending[0])
                    self.pending.pop(0)
            except Exception as e:  # e.g. "database is locked" while the daemon writes; training must go on
                self.context.log.warning(f"recording checkpoints failed this time, will retry with the next one: {e}")
        return True

    def apply(self, event: CheckpointEvent) -> None:
        """A saved checkpoint becomes a partition and a materialization; a deleted one stops being a partition."""
        if event.event == SAVED:
            self.report([event.checkpoint], None)
            return
        key = self.key(event.checkpoint)
        if self.context.instance.has_dynamic_partition(CHECKPOINTS, key):
            self.context.instance.delete_dynamic_partition(CHECKPOINTS, key)
        self.recorded.pop(key, None)
        self.context.log.info(f"checkpoint {key} was deleted by the retention policy and is no longer a partition")

    def record(self, registry: Registry, manifest: Manifest) -> list[str]:
        """Report every checkpoint kept in the published artifact of `manifest`, where the registry keeps it (in an object
        store, its records are read one by one: the checkpoints are not fetched); returns their keys."""
        with self.lock:
            while self.pending:  # the run is over: what could not be recorded while it ran must be now
                self.apply(self.pending.pop(0))
            saved = kept_in(registry, manifest, Path(manifest.digest))
            return self.report(saved, manifest.digest, registry.where(manifest.digest))

    def report(self, saved: list[SavedCheckpoint], stage_digest: str | None, where: str | None = None) -> list[str]:
        """Partitions and materializations for `saved` (in the artifact at `where`, or at their own paths), each once per
        place it is stored; returns their keys."""
        keys = [self.key(checkpoint) for checkpoint in saved]
        new = [key for key in keys if key not in self.recorded and not self.context.instance.has_dynamic_partition(CHECKPOINTS, key)]
        if new:
            self.context.instance.add_dynamic_partitions(CHECKPOINTS, new)
        for key, checkpoint in zip(keys, saved, strict=True):
            path = f"{where}/{checkpoint.name}" if where else str(checkpoint.path)
            if self.recorded.get(key) == path:
                continue
            self.context.log_event(AssetMaterialization(asset_key=CHECKPOINTS, partition=key, metadata=self.metadata(checkpoint, stage_digest, path)))
            self.recorded[key] = path
        return keys

    def key(self, checkpoint: SavedCheckpoint) -> str:
        return partition_key(self.experiment.name, self.spec.kind, checkpoint.step)

    def forget_deleted(self, kept: list[str]) -> None:
        """Remove the partitions of checkpoints recorded during training that are not `kept` (a deletion message that
        could not be recorded when it came)."""
        if gone := sorted(set(self.recorded) - set(kept)):
            for key in gone:
                self.context.instance.delete_dynamic_partition(CHECKPOINTS, key)
            self.context.log.info(f"{len(gone)} checkpoints deleted by the retention policy are no longer partitions: {', '.join(gone)}")

    def metadata(self, checkpoint: SavedCheckpoint, stage_digest: str | None, path: str) -> dict:
        """What an evaluation needs to load exactly these bytes (`path`: where they are), and what a person wants to see."""
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
            "path": MetadataValue.path(path),
            "stored": "artifact" if stage_digest else "training (may be deleted by retention)",
            "stage_digest": stage_digest or "not published yet",
            "experiment": self.experiment.name,
            "git_commit": self.git_commit,
            "training": MetadataValue.json(self.spec.to_json()),
            "eval": MetadataValue.json({"max_bytes": evaluation.max_bytes, "batch_size": evaluation.batch_size, "primary": evaluation.primary}),
        }
