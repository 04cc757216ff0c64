"""The leaderboard: every experiment's latest evaluation, published as an artifact and shown as Markdown."""


from dagster import (
    AssetExecutionContext,
    AssetSelection,
    AutomationCondition,
    AutomationConditionSensorDefinition,
    DataVersion,
    DefaultSensorStatus,
    MaterializeResult,
    MetadataValue,
    asset,
)

from assets.partitions import EXPERIMENTS
from assets.records import latest_metadata
from factory.evals.leaderboard import build_rows
from factory.registry import git_commit
from factory.stages.leaderboard import publish_leaderboard
from resources import FactoryStores


# Refresh whenever any experiment's evaluation changes (runs started by the git sensor included).
REFRESH = AutomationCondition.any_deps_updated() & ~AutomationCondition.in_progress() & ~AutomationCondition.any_deps_in_progress()


@asset(
    deps=["evaluation"],
    description="All experiments ranked by validation bits-per-byte.",
    kinds={"markdown"},
    group_name="pipeline",
    automation_condition=REFRESH,
)
def leaderboard(context: AssetExecutionContext, stores: FactoryStores) -> MaterializeResult:
    registry = stores.registry()
    evaluations = []
    for name in context.instance.get_dynamic_partitions(EXPERIMENTS):
        metadata = latest_metadata(context.instance, "evaluation", name)
        manifest = registry.lookup(metadata["fingerprint"]) if metadata else None
        if manifest is None:
            context.log.info(f"{name}: no intact evaluation yet; left off the leaderboard")
            continue
        evaluations.append((name, manifest))
    manifest, markdown = publish_leaderboard(registry, build_rows(evaluations), git_commit())
    metadata = {**manifest.metadata(), "leaderboard": MetadataValue.md(markdown), "experiments": len(evaluations)}
    return MaterializeResult(metadata=metadata, data_version=DataVersion(manifest.digest))


leaderboard_automation = AutomationConditionSensorDefinition(
    "leaderboard_automation", target=AssetSelection.assets("leaderboard"), default_status=DefaultSensorStatus.RUNNING
)
