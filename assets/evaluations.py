"""The `evaluations` asset: one partition per checkpoint x benchmark, evaluated as checkpoints appear.

A new checkpoint partition makes its evaluations due (the automation sensor runs them while
training goes on); a new benchmark partition makes every existing checkpoint's evaluation on it
due, which is a backfill. A run evaluates many partitions in one process (the backfill policy
puts up to EVALS_PER_RUN partitions in a run), so a backfill over a thousand checkpoints is a few
dozen launches, not a thousand. A batch is an `evaluation` stage (`factory.stages.evaluation`): the launcher runs it
where it runs every stage (a process here, a Volcano Job on a cluster).
"""

import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetObservation,
    AutomationCondition,
    BackfillPolicy,
    BetaWarning,
    DagsterInstance,
    DataVersion,
    Failure,
    MaterializeResult,
    MetadataValue,
    PipesExecutionResult,
    asset,
)
from pydantic import ValidationError

from assets.benchmark_data import ensure_benchmark_data
from assets.partitions import CHECKPOINTS, evaluation_key, evaluations_partitions
from assets.records import latest_metadata, latest_metadata_by_partition
from factory.config.fingerprint import code_identity
from factory.config.pools import EVALUATION_POOL
from factory.errors import ConfigError
from factory.evals.benchmarks import benchmark
from factory.registry import Registry
from factory.runtime.request import StageRequest
from factory.stages.evaluation import CheckpointRef, EvalItem, batch_provenance, batch_spec, batch_summary
from resources import FactoryStores, StageLauncher

EVALS_PER_RUN = 50
"""Partitions a backfill puts in one run (one process, one model load per checkpoint)."""
CHECKPOINT_FIELDS = ("step", "tokens_seen", "path", "sha256", "training", "eval", "git_commit", "experiment")
# The backfill policy is beta in the Dagster this project pins: its warning, in every process that loads the assets, is
# nothing a user can act on. Only that warning is silenced.
warnings.filterwarnings("ignore", category=BetaWarning, message="Parameter `backfill_policy`")


@asset(
    partitions_def=evaluations_partitions,
    deps=[CHECKPOINTS],
    description="Each checkpoint scored on each benchmark; a result is an immutable artifact, never computed twice.",
    kinds={"torch"},
    group_name="pipeline",
    backfill_policy=BackfillPolicy.multi_run(max_partitions_per_run=EVALS_PER_RUN),
    automation_condition=AutomationCondition.eager(),
    pool=EVALUATION_POOL,  # evaluation batches wait for a slot of the instance's `evaluation` pool (assets/pools.py)
)
def evaluations(
    context: AssetExecutionContext, stores: FactoryStores, launcher: StageLauncher
) -> Iterator[PipesExecutionResult | MaterializeResult]:
    checkpoints = {evaluations_partitions.get_partition_key_from_str(key).keys_by_dimension["checkpoint"] for key in context.partition_keys}
    recorded = latest_metadata_by_partition(context.instance, CHECKPOINTS, checkpoints)
    items = tuple(eval_item(context.instance, key, recorded) for key in context.partition_keys)
    registry, code = stores.registry(), code_identity("local")  # the code location's evaluator scores every experiment alike
    found = {item.partition: manifest for item in items if (manifest := registry.lookup(item.fingerprint(code)))}
    if len(found) == len(items):  # nothing to compute: no process, no model loaded
        context.log.info(f"all {len(items)} checkpoint x benchmark pairs are evaluated already; reusing their results")
        scores, version = batch_summary(found)
        yield MaterializeResult(metadata={"scores": MetadataValue.json(scores), "evaluated": len(scores), "cache": "hit"},
                                data_version=DataVersion(version))
    else:
        ensure_benchmark_data(context, stores, (item.benchmark for item in items if item.partition not in found))
        context.log.info(f"evaluating {len(items) - len(found)} of {len(items)} checkpoint x benchmark pairs in one stage")
        spec = batch_spec(items, code)
        request = StageRequest(spec=spec, registry=str(registry.root), catalog=stores.catalog(),
                               provenance=batch_provenance(items, spec.config, context.run_id))
        yield from launcher.launch(context, request)
    # One process reports one materialization for the whole batch; each partition's own score and artifact are observed here.
    for item in items:
        if manifest := found.get(item.partition) or registry.lookup(item.fingerprint(code)):
            context.log_event(AssetObservation(
                asset_key="evaluations", partition=item.partition,
                metadata={"value": manifest.summary["value"], "count": manifest.summary["count"], "result": manifest.digest,
                          "checkpoint_sha256": item.checkpoint.sha256},
            ))


def eval_item(instance: DagsterInstance, key: str, metadata: Mapping[str, Mapping[str, Any]] | None = None) -> EvalItem:
    """The evaluation of one partition: its benchmark, and the checkpoint exactly as its partition recorded it (read from
    the event log, or from `metadata`: checkpoint partition -> its newest materialization's, read for many at once)."""
    dimensions = evaluations_partitions.get_partition_key_from_str(key).keys_by_dimension
    name, checkpoint = dimensions["benchmark"], dimensions["checkpoint"]
    recorded = latest_metadata(instance, CHECKPOINTS, checkpoint) if metadata is None else metadata.get(checkpoint)
    return pair_item(name, checkpoint, recorded)


def pair_item(name: str, checkpoint: str, recorded: Mapping[str, Any] | None) -> EvalItem:
    """The evaluation of checkpoint `checkpoint` (its newest materialization's metadata: `recorded`, or None) on
    benchmark `name`: one partition. Failure, saying what to do, when it cannot be evaluated."""
    key = evaluation_key(name, checkpoint)
    try:
        benchmark(name)
    except ConfigError as e:
        raise Failure(description=f"{key}: {e}") from e
    if recorded is None or any(field not in recorded for field in CHECKPOINT_FIELDS):
        raise Failure(description=f"{key}: checkpoint {checkpoint} has no recorded materialization with its sha256; rerun its training stage")
    try:
        ref = CheckpointRef(key=checkpoint, **{field: recorded[field] for field in CHECKPOINT_FIELDS})
    except ValidationError as e:
        raise Failure(description=f"{key}: checkpoint {checkpoint} has a recorded materialization that does not say how to load it "
                                  f"({e.error_count()} problems, first: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}); "
                                  "rerun its training stage") from e
    return EvalItem(partition=key, benchmark=name, checkpoint=ref)


def evaluated(registry: Registry, code: str, name: str, checkpoint: str, recorded: Mapping[str, Any] | None) -> bool:
    """Whether the result of checkpoint `checkpoint` on benchmark `name` (`recorded` as `pair_item` reads it) is in the
    registry already (its run would compute nothing); a partition that cannot be evaluated is not, so that its run says
    why."""
    try:
        item = pair_item(name, checkpoint, recorded)
    except Failure:
        return False
    return registry.lookup(item.fingerprint(code)) is not None
