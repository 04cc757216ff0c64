"""The best model moves only when the leaderboard's blocking check passes (a real Dagster instance and registry)."""

import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, materialize

from assets.execution import gate_refused
from assets.leaderboard import best_model, leaderboard
from factory.registry import ArtifactStore
from factory.evals.publish import current_best, latest_board
from resources import FactoryStores
from tests.conftest import publish_model, publish_result


@pytest.fixture
def gate(tmp_path):
    registry = ArtifactStore(tmp_path / "registry")
    instance = DagsterInstance.ephemeral()

    def run():
        return materialize([leaderboard, best_model], instance=instance, resources={"stores": FactoryStores(root=str(tmp_path))},
                           raise_on_error=False)

    return registry, instance, run


def check_of(result):
    [check] = [e.event_specific_data for e in result.all_events if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION]
    return check


def test_a_leader_that_regresses_on_another_benchmark_is_not_marked_best(gate):
    registry, instance, run = gate
    publish_result(registry, "a", "val_bpb", 2.0)
    publish_result(registry, "a", "next_line", 0.30)
    publish_model(registry, "a")
    first = run()
    assert first.success and check_of(first).passed and current_best(registry).experiment == "a"
    publish_result(registry, "b", "val_bpb", 1.8)  # better on the primary benchmark...
    publish_result(registry, "b", "next_line", 0.10)  # ...but a third of a's next-line accuracy
    publish_model(registry, "b")
    second = run()
    assert not second.success and gate_refused(second)  # refused by the gate, which `factory run` reports as news
    check = check_of(second)
    assert not check.passed and check.description.startswith("next_line: 0.1000 vs 0.3000 for the current best a")
    assert "where 0.1146 is allowed" in check.description  # 2 standard errors of 64 items at 0.30
    assert latest_board(registry).rows[0].experiment == "b"  # the leaderboard shows the truth...
    assert current_best(registry).experiment == "a"  # ...but the best model did not move
    materialized = [e.asset_key for e in second.all_events if e.event_type == DagsterEventType.ASSET_MATERIALIZATION]
    assert materialized == [AssetKey("leaderboard")]


def test_a_leader_within_the_tolerance_everywhere_is_marked_best(gate):
    registry, instance, run = gate
    publish_result(registry, "a", "val_bpb", 2.0)
    publish_result(registry, "a", "next_line", 0.30)
    publish_model(registry, "a")
    assert run().success
    publish_result(registry, "c", "val_bpb", 1.8)
    publish_result(registry, "c", "next_line", 0.297)  # 1% worse: within the 2% tolerance
    publish_model(registry, "c")
    result = run()
    assert result.success and check_of(result).passed
    assert current_best(registry).experiment == "c"


def test_a_toy_with_a_lower_val_bpb_on_its_own_data_does_not_become_best_over_a_model_better_on_heldout_bpb(gate):
    registry, instance, run = gate
    publish_result(registry, "tiny-code-lm", "val_bpb", 2.0, blend="c" * 64)
    publish_result(registry, "tiny-code-lm", "heldout_bpb", 2.3, blend="c" * 64)
    publish_model(registry, "tiny-code-lm", blend="c" * 64)
    assert run().success and current_best(registry).experiment == "tiny-code-lm"
    publish_result(registry, "toy", "val_bpb", 1.2, step=40, blend="d" * 64)  # its own notes are easy to predict...
    publish_result(registry, "toy", "heldout_bpb", 3.1, step=40, blend="d" * 64)  # ...the shared held-out code is not
    publish_model(registry, "toy", step=40, blend="d" * 64)
    result = run()
    assert result.success and check_of(result).passed  # val_bpb 2.0 vs 1.2 is no regression: other data
    assert [row.experiment for row in latest_board(registry).rows] == ["tiny-code-lm", "toy"]
    assert current_best(registry).experiment == "tiny-code-lm"


def test_the_best_model_does_not_move_on_an_own_split_score_of_another_blend(gate):
    registry, instance, run = gate
    publish_result(registry, "tiny-code-lm", "val_bpb", 2.0, blend="c" * 64)
    publish_model(registry, "tiny-code-lm", blend="c" * 64)
    assert run().success and current_best(registry).experiment == "tiny-code-lm"
    publish_result(registry, "toy", "val_bpb", 1.2, step=40, blend="d" * 64)
    publish_model(registry, "toy", step=40, blend="d" * 64)
    second = run()
    assert latest_board(registry).rows[0].experiment == "toy"  # the newest results rank a board of own splits alone...
    assert not second.success and gate_refused(second)
    assert "toy leads on val_bpb measured on its own held-out split" in check_of(second).description
    assert current_best(registry).experiment == "tiny-code-lm"  # ...but the best model does not move on them


def test_an_interrupted_run_better_on_every_benchmark_is_marked_unfinished_and_never_best(gate):
    registry, instance, run = gate
    publish_result(registry, "a", "val_bpb", 2.0)
    publish_model(registry, "a")
    assert run().success and current_best(registry).experiment == "a"
    publish_result(registry, "cut", "val_bpb", 1.0, training="run-cut")  # its run was interrupted: no artifact, no model
    result = run()
    assert result.success
    cut = next(row for row in latest_board(registry).rows if row.experiment == "cut")
    assert not cut.ranked and cut.note.startswith("unfinished")
    assert current_best(registry).experiment == "a" and current_best(registry).model
