"""The `checkpoints` asset: one partition per saved checkpoint, recorded by the training stage that saved it.

Its partitions are `<experiment>__<stage>-<step:06d>`. Nothing computes a checkpoint on its own,
so the asset is declared, not defined: the training stage's asset reports a materialization for
every checkpoint its artifact keeps (evaluations will key off these partitions).
"""

from pathlib import Path

from dagster import AssetExecutionContext, AssetMaterialization, AssetSpec, MetadataValue

from assets.partitions import CHECKPOINTS, checkpoints_partitions
from factory.train.checkpoint import partition_key, published

checkpoints = AssetSpec(
    key=CHECKPOINTS,
    deps=["pretrain"],
    partitions_def=checkpoints_partitions,
    description="Every kept checkpoint of every training run: step, tokens seen, loss, learning rate, sha256 and size.",
    kinds={"torch"},
    group_name="pipeline",
)


def record_checkpoints(context: AssetExecutionContext, experiment: str, stage: str, artifact: Path, digest: str) -> list[str]:
    """Add a `checkpoints` partition per checkpoint in `artifact` and report its materialization; returns the keys."""
    saved = published(artifact)
    keys = [partition_key(experiment, stage, checkpoint.step) for checkpoint in saved]
    new = [key for key in keys if not context.instance.has_dynamic_partition(CHECKPOINTS, key)]
    if new:
        context.instance.add_dynamic_partitions(CHECKPOINTS, new)
    for key, checkpoint in zip(keys, saved, strict=True):
        metrics = checkpoint.metrics
        context.log_event(AssetMaterialization(
            asset_key=CHECKPOINTS,
            partition=key,
            metadata={
                "step": checkpoint.step,
                "tokens_seen": int(metrics.get("tokens_seen", 0)),
                "loss": float(metrics.get("loss", float("nan"))),
                "lr": float(metrics.get("lr", float("nan"))),
                "sha256": checkpoint.sha256,
                "size_bytes": checkpoint.size,
                "artifact": MetadataValue.path(str(artifact / checkpoint.name)),
                "stage_digest": digest,
            },
        ))
    return keys
