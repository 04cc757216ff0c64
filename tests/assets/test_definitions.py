"""The code location: the asset graph's lineage and partitioning as the Dagster UI shows it."""

import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance, DynamicPartitionsDefinition, MultiPartitionsDefinition, evaluate_automation_conditions

from assets.definitions import defs
from assets.partitions import BENCHMARKS, CHECKPOINTS, EXPERIMENTS

LINEAGE = {
    "raw_datasets": set(),
    "deduped_datasets": {"raw_datasets"},
    "filtered_datasets": {"deduped_datasets"},
    "blend": {"filtered_datasets"},
    "tokenizer": {"blend"},
    "pretrain": {"blend", "tokenizer"},
    "sft": {"blend", "tokenizer", "pretrain", "code_exec_tasks", "filtered_datasets"},  # the filtered datasets for sft.data.dataset
    "rl": {"blend", "tokenizer", "pretrain", "sft", "code_exec_tasks"},
    "checkpoints": {"pretrain", "sft", "rl"},
    "model": {"pretrain", "sft", "rl", "tokenizer"},
    "evaluations": {"checkpoints"},
    "leaderboard": {"evaluations"},
    "best_model": {"leaderboard"},
    "run_report": {"model", "leaderboard"},
    "code_exec_tasks": set(),
    "heldout_corpus": set(),
    "humaneval_problems": set(),
    "production_model": {"model"},
}


def test_asset_graph_has_the_lineage_from_raw_data_to_leaderboard():
    graph = defs.resolve_asset_graph()
    parents = {key.to_user_string(): {p.to_user_string() for p in graph.get(key).parent_keys} for key in graph.get_all_asset_keys()}
    assert parents == LINEAGE


def test_stage_assets_are_partitioned_by_experiment():
    graph = defs.resolve_asset_graph()
    for name in LINEAGE:
        partitions = graph.get(AssetKey(name)).partitions_def
        if name in ("leaderboard", "best_model", "code_exec_tasks", "heldout_corpus", "humaneval_problems", "production_model"):
            assert partitions is None
        elif name == "checkpoints":
            assert isinstance(partitions, DynamicPartitionsDefinition) and partitions.name == "checkpoints"
        elif name == "evaluations":
            assert isinstance(partitions, MultiPartitionsDefinition)
            assert {d.name: d.partitions_def.name for d in partitions.partitions_defs} == {"benchmark": BENCHMARKS, "checkpoint": CHECKPOINTS}
        else:
            assert isinstance(partitions, DynamicPartitionsDefinition) and partitions.name == EXPERIMENTS


def test_filtered_datasets_carry_blocking_checks():
    graph = defs.resolve_asset_graph()
    checks = {key.name: graph.get_check_spec(key) for key in graph.asset_check_keys if key.asset_key == AssetKey("filtered_datasets")}
    assert set(checks) == {"non_empty", "schema", "duplicate_share"}
    assert all(spec.blocking for spec in checks.values())


def test_a_new_checkpoint_makes_its_evaluations_due_and_a_new_benchmark_makes_every_checkpoints_due():
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(BENCHMARKS, ["val_bpb", "next_line"])
    instance.add_dynamic_partitions(CHECKPOINTS, ["a__pretrain-000100"])
    first = evaluate_automation_conditions(defs=defs, instance=instance)
    assert first.total_requested == 0
    instance.report_runless_asset_event(AssetMaterialization(CHECKPOINTS, partition="a__pretrain-000100"))
    second = evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
    assert second.get_requested_partitions(AssetKey("evaluations")) == {"val_bpb|a__pretrain-000100", "next_line|a__pretrain-000100"}
    instance.add_dynamic_partitions(CHECKPOINTS, ["a__pretrain-000200"])
    instance.report_runless_asset_event(AssetMaterialization(CHECKPOINTS, partition="a__pretrain-000200"))
    third = evaluate_automation_conditions(defs=defs, instance=instance, cursor=second.cursor)
    assert third.get_requested_partitions(AssetKey("evaluations")) == {"val_bpb|a__pretrain-000200", "next_line|a__pretrain-000200"}
    instance.add_dynamic_partitions(BENCHMARKS, ["python_sanity"])
    fourth = evaluate_automation_conditions(defs=defs, instance=instance, cursor=third.cursor)
    assert fourth.get_requested_partitions(AssetKey("evaluations")) == {"python_sanity|a__pretrain-000100", "python_sanity|a__pretrain-000200"}


def test_leaderboard_and_best_model_refresh_when_an_evaluation_changes():
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(BENCHMARKS, ["val_bpb"])
    instance.add_dynamic_partitions(CHECKPOINTS, ["a__pretrain-000100"])
    first = evaluate_automation_conditions(defs=defs, instance=instance)
    instance.report_runless_asset_event(AssetMaterialization("evaluations", partition="val_bpb|a__pretrain-000100"))
    second = evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
    # Requested together, so they run in one run, where the leaderboard's blocking check can hold best_model back.
    assert second.get_requested_partitions(AssetKey("leaderboard")) == {None}
    assert second.get_requested_partitions(AssetKey("best_model")) == {None}
    assert evaluate_automation_conditions(defs=defs, instance=instance, cursor=second.cursor).total_requested == 0


def test_sensors_are_running_by_default():
    from dagster import DefaultSensorStatus

    for name in ("experiments_at_head", "automation"):
        assert defs.resolve_sensor_def(name).default_status == DefaultSensorStatus.RUNNING


@pytest.mark.parametrize(("benchmark", "checkpoint"), [("heldout_bpb", "tiny-code-lm__pretrain-000100"), ("a|b", "c"), ("", "x__sft-000001")])
def test_an_evaluation_key_is_the_multi_partition_key_dagster_makes(benchmark, checkpoint):
    from dagster import MultiPartitionKey

    from assets.partitions import evaluation_key, evaluations_partitions

    key = evaluation_key(benchmark, checkpoint)
    assert key == str(MultiPartitionKey({"checkpoint": checkpoint, "benchmark": benchmark}))
    if "|" not in benchmark + checkpoint:
        assert evaluations_partitions.get_partition_key_from_str(key).keys_by_dimension == {"benchmark": benchmark, "checkpoint": checkpoint}
