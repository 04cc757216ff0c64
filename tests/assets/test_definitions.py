"""The code location: the asset graph's lineage and partitioning as the Dagster UI shows it."""

from dagster import AssetKey, DynamicPartitionsDefinition

from assets.definitions import defs
from assets.partitions import EXPERIMENTS

LINEAGE = {
    "raw_datasets": set(),
    "deduped_datasets": {"raw_datasets"},
    "filtered_datasets": {"deduped_datasets"},
    "blend": {"filtered_datasets"},
    "tokenizer": {"blend"},
    "pretrain": {"blend", "tokenizer"},
    "checkpoints": {"pretrain"},
    "model": {"pretrain", "tokenizer"},
    "evaluation": {"model", "blend"},
    "leaderboard": {"evaluation"},
}


def test_asset_graph_has_the_lineage_from_raw_data_to_leaderboard():
    graph = defs.resolve_asset_graph()
    parents = {key.to_user_string(): {p.to_user_string() for p in graph.get(key).parent_keys} for key in graph.get_all_asset_keys()}
    assert parents == LINEAGE


def test_stage_assets_are_partitioned_by_experiment():
    graph = defs.resolve_asset_graph()
    for name in LINEAGE:
        partitions = graph.get(AssetKey(name)).partitions_def
        if name == "leaderboard":
            assert partitions is None
        elif name == "checkpoints":
            assert isinstance(partitions, DynamicPartitionsDefinition) and partitions.name == "checkpoints"
        else:
            assert isinstance(partitions, DynamicPartitionsDefinition) and partitions.name == EXPERIMENTS


def test_filtered_datasets_carry_blocking_checks():
    graph = defs.resolve_asset_graph()
    checks = {key.name: graph.get_check_spec(key) for key in graph.asset_check_keys if key.asset_key == AssetKey("filtered_datasets")}
    assert set(checks) == {"non_empty", "schema", "duplicate_share"}
    assert all(spec.blocking for spec in checks.values())


def test_leaderboard_refreshes_when_an_evaluation_changes():
    from dagster import AssetMaterialization, DagsterInstance, evaluate_automation_conditions

    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(EXPERIMENTS, ["a", "b"])
    first = evaluate_automation_conditions(defs=defs, instance=instance)
    assert first.total_requested == 0
    instance.report_runless_asset_event(AssetMaterialization("evaluation", partition="a"))
    second = evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
    assert second.total_requested == 1
    assert second.get_requested_partitions(AssetKey("leaderboard")) == {None}
    assert evaluate_automation_conditions(defs=defs, instance=instance, cursor=second.cursor).total_requested == 0


def test_sensors_are_running_by_default():
    from dagster import DefaultSensorStatus

    for name in ("experiments_at_head", "leaderboard_automation"):
        assert defs.resolve_sensor_def(name).default_status == DefaultSensorStatus.RUNNING
