"""The `evaluations` asset: one partition per checkpoint x benchmark, evaluated as checkpoints appear.

A new checkpoint partition makes its evaluations due (the automation sensor runs them while
training goes on); a new benchmark partition makes every existing checkpoint's evaluation on it
due, which is a backfill. A run evaluates many partitions in one process (the backfill policy
puts up to EVALS_PER_RUN partitions in a run), so a backfill over a thousand checkpoints is a few
dozen launches, not a thousand.
"""

from collections.abc import Iterator

from dagster import (
    AssetExecutionContext,
    AssetObservation,
    AutomationCondition,
    BackfillPolicy,
    Failure,
    PipesExecutionResult,
    asset,
)

from assets.partitions import CHECKPOINTS, evaluations_partitions
from assets.records import latest_metadata
from factory.config.fingerprint import code_identity
from factory.errors import ConfigError
from factory.evals.benchmarks import benchmark
from factory.stages.evaluate import CheckpointRef, EvalItem, EvalRequest
from resources import FactoryStores, StageLauncher

EVALS_PER_RUN = 50
"""Partitions a backfill puts in one run (one process, one model load per checkpoint)."""
CHECKPOINT_FIELDS = ("step", "tokens_seen", "path", "sha256", "training", "eval", "git_commit", "experiment")


@asset(
    partitions_def=evaluations_partitions,
    deps=[CHECKPOINTS],
    description="Each checkpoint scored on each benchmark; a result is an immutable artifact, never computed twice.",
    kinds={"torch"},
    group_name="pipeline",
    backfill_policy=BackfillPolicy.multi_run(max_partitions_per_run=EVALS_PER_RUN),
    automation_condition=AutomationCondition.eager(),
)
def evaluations(context: AssetExecutionContext, stores: FactoryStores, launcher: StageLauncher) -> Iterator[PipesExecutionResult]:
    items = tuple(eval_item(context, key) for key in context.partition_keys)
    context.log.info(f"evaluating {len(items)} checkpoint x benchmark pairs in one process")
    registry = stores.registry()
    request = EvalRequest(items=items, registry=str(registry.root), catalog=stores.catalog(), code=code_identity("local"), run_id=context.run_id)
    yield from launcher.evaluate(context, request)
    # One process reports one materialization for the whole batch; each partition's own score and artifact are observed here.
    for item in items:
        if manifest := registry.lookup(item.fingerprint(request.code)):
            context.log_event(AssetObservation(
                asset_key="evaluations", partition=item.partition,
                metadata={"value": manifest.summary["value"], "count": manifest.summary["count"], "result": manifest.digest,
                          "checkpoint_sha256": item.checkpoint.sha256},
            ))


def eval_item(context: AssetExecutionContext, key: str) -> EvalItem:
    """The evaluation of one partition: its benchmark, and the checkpoint exactly as its partition recorded it."""
    dimensions = evaluations_partitions.get_partition_key_from_str(key).keys_by_dimension
    name, checkpoint = dimensions["benchmark"], dimensions["checkpoint"]
    try:
        benchmark(name)
    except ConfigError as e:
        raise Failure(description=f"{key}: {e}") from e
    metadata = latest_metadata(context.instance, CHECKPOINTS, checkpoint)
    if metadata is None or any(field not in metadata for field in CHECKPOINT_FIELDS):
        raise Failure(description=f"{key}: checkpoint {checkpoint} has no recorded materialization with its sha256; rerun its training stage")
    ref = CheckpointRef(key=checkpoint, **{field: metadata[field] for field in CHECKPOINT_FIELDS})
    return EvalItem(partition=key, benchmark=name, checkpoint=ref)
