"""The Neptune tracker in offline mode, read back from the sqlite files neptune-scale writes."""

import logging
from pathlib import Path

import pytest
from neptune_scale.sync.operations_repository import OperationsRepository, OperationType

from factory.track.base import TrackingConfig, open_run

CONFIG = TrackingConfig(backend="neptune", project="factory/tests")
EVERYTHING = 1 << 40


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No token: the backend must choose offline mode."""
    monkeypatch.delenv("NEPTUNE_API_TOKEN", raising=False)


def read_offline(run_dir: Path) -> tuple[set[str], dict[str, object], dict[str, list[tuple[int, float]]]]:
    """(run ids, configs, metric series) from every offline session of one run."""
    run_ids: set[str] = set()
    configs: dict[str, object] = {}
    series: dict[str, list[tuple[int, float]]] = {}
    for db in sorted(run_dir.glob("*/run_operations.sqlite3")):
        repo = OperationsRepository(db_path=db)
        run_ids.add(repo.get_metadata().run_id)
        for op in repo.get_operations(up_to_bytes=EVERYTHING):
            if op.operation_type == OperationType.CREATE_RUN:
                run_ids.add(op.operation.family)
                continue
            for key, value in op.operation.assign.items():
                configs[key] = getattr(value, value.WhichOneof("value"))
            for key, value in op.operation.append.items():
                series.setdefault(key, []).append((op.operation.step.whole, value.float64))
        repo.close(cleanup_files=False)
    return run_ids, configs, series


def test_params_metrics_tags_and_status_are_written_offline(tmp_path):
    run = open_run(CONFIG, tmp_path, name="tiny/pretrain", run_key="fp-1")
    run.log_params({"model": {"n_layer": 2}, "lr": 0.001, "betas": [0.9, 0.95]})
    for step, loss in [(0, 4.0), (10, 3.0), (20, 2.5)]:
        run.log_metrics(step, {"train/loss": loss})
    run.set_tags({"stage": "pretrain"})
    run.finish("finished")

    run_ids, configs, series = read_offline(tmp_path / "neptune" / "fp-1")
    assert run.id == "fp-1"
    assert run.url == str((tmp_path / "neptune" / "fp-1").resolve())
    assert run_ids == {"fp-1"}
    assert configs["params/model.n_layer"] == 2
    assert configs["params/lr"] == 0.001
    assert configs["params/betas"] == "[0.9, 0.95]"
    assert configs["tags/stage"] == "pretrain"
    assert configs["name"] == "tiny/pretrain"
    assert configs["status"] == "finished"
    assert series["train/loss"] == [(0, 4.0), (10, 3.0), (20, 2.5)]


def test_reopening_a_key_continues_the_same_neptune_run(tmp_path):
    first = open_run(CONFIG, tmp_path, name="n", run_key="fp-1")
    first.log_metrics(1, {"loss": 2.0})
    first.finish("failed")
    second = open_run(CONFIG, tmp_path, name="n", run_key="fp-1")
    second.log_metrics(2, {"loss": 1.0})
    second.finish("finished")

    run_ids, configs, series = read_offline(tmp_path / "neptune" / "fp-1")
    assert len(list((tmp_path / "neptune" / "fp-1").iterdir())) == 2  # one offline file per session
    assert run_ids == {"fp-1"}
    assert series["loss"] == [(1, 2.0), (2, 1.0)]
    assert configs["status"] == "finished"


def test_closing_offline_logs_no_sync_nagging(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="neptune"):
        open_run(CONFIG, tmp_path, name="n", run_key="fp-1").finish("finished")

    assert not [record for record in caplog.records if "neptune sync" in record.getMessage()]
