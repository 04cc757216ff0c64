"""The `run_report` asset: per experiment, one HTML page with its curves, evaluations, decisions, cost and lineage.

The plotting code (matplotlib) is imported when a report is made, not when the code location loads.
"""

from dagster import AssetExecutionContext, DataVersion, Failure, MaterializeResult, MetadataValue, asset

from assets.partitions import COMMIT_TAG, experiments_partitions
from assets.records import latest_metadata
from factory.config.kinds import model_kind
from factory.config.stages import stages_of
from factory.registry import git_commit
from resources import ExperimentFiles, FactoryStores


@asset(
    partitions_def=experiments_partitions,
    deps=[model_kind().name, "leaderboard"],
    description="The experiment's run report: loss and eval-vs-step curves, control decisions, cost per stage, cache hits, lineage, config and reasoning.",
    kinds={"html"},
    group_name="pipeline",
)
def run_report(context: AssetExecutionContext, experiments: ExperimentFiles, stores: FactoryStores) -> MaterializeResult:
    from factory.evals.run_report import publish_report, report_inputs
    from factory.registry.layout import REPORT_FILE

    experiment = experiments.load(context.partition_key, commit=context.run.tags.get(COMMIT_TAG))
    stages = {}
    for kind in stages_of(experiment):
        metadata = latest_metadata(context.instance, kind, experiment.name)
        if metadata is None:
            raise Failure(description=f"{experiment.name}: {kind} has no materialization yet; run the experiment first")
        stages[kind] = (metadata["fingerprint"], metadata.get("cache", "miss"))
    registry = stores.registry()
    commit = latest_metadata(context.instance, stages_of(experiment)[-1], experiment.name).get("git_commit") or git_commit()
    manifest = publish_report(registry, report_inputs(registry, experiment, stages, commit))
    page = registry.path(manifest.digest) / REPORT_FILE
    return MaterializeResult(
        metadata={**manifest.metadata(), "report": MetadataValue.path(str(page)), "open": MetadataValue.url(page.as_uri())},
        data_version=DataVersion(manifest.digest),
    )
