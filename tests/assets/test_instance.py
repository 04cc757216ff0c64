"""The embedded instance (`assets/instance.py`): Dagster's SQLite storage in the same files, without an engine per query
or alembic's scripts read again for every run."""

import contextlib
import sqlite3
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, asset, materialize
from sqlalchemy import event
from sqlalchemy.pool import Pool

from assets.instance import FactoryInstance
from factory.cli.common import INSTANCE_CLASS_YAML, dagster_home


@asset
def spoken() -> int:
    print("said by the step")
    return 1


@asset
def heard(spoken: int) -> int:
    return spoken + 1


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """The embedded default's instance directory (what `factory` writes), on SQLite."""
    monkeypatch.delenv("FACTORY_DATABASE_URL", raising=False)
    return dagster_home(tmp_path / "root")


def test_each_database_is_opened_through_one_engine_however_many_events_the_runs_store(home):
    opened: list[str] = []  # an engine's pool connects for the first time once: Dagster's made an engine for every query

    def first(connection, _record) -> None:
        [(_, _, path)] = connection.execute("PRAGMA database_list").fetchall()
        if Path(path).is_relative_to(home):
            opened.append(Path(path).name)

    event.listen(Pool, "first_connect", first)
    try:
        with DagsterInstance.from_config(str(home)) as instance:
            assert isinstance(instance, FactoryInstance)
            before = len(opened)
            runs = [materialize([spoken, heard], instance=instance) for _ in range(3)]
            stored = sum(len(instance.all_logs(run.run_id)) for run in runs)
    finally:
        event.remove(Pool, "first_connect", first)
    assert all(run.success for run in runs) and stored > 60
    assert sorted(opened[before:]) == sorted(f"{run.run_id}.db" for run in runs), "one engine for each run's own database, none per query"


def test_dagsters_own_storage_reads_and_writes_the_same_files(home):
    with DagsterInstance.from_config(str(home)) as instance:
        ours = materialize([spoken, heard], instance=instance)
    written = (home / "dagster.yaml").read_text()
    assert INSTANCE_CLASS_YAML in written
    (home / "dagster.yaml").write_text(written.replace(INSTANCE_CLASS_YAML, ""))
    with DagsterInstance.from_config(str(home)) as plain:
        assert type(plain) is DagsterInstance
        assert plain.get_latest_materialization_event(AssetKey("heard")).run_id == ours.run_id
        theirs = materialize([spoken, heard], instance=plain)
    (home / "dagster.yaml").write_text(written)
    with DagsterInstance.from_config(str(home)) as instance:
        assert {run.run_id for run in instance.get_runs()} == {ours.run_id, theirs.run_id}
        assert instance.get_latest_materialization_event(AssetKey("heard")).run_id == theirs.run_id
    assert schema(home, ours.run_id) == schema(home, theirs.run_id), "a run's database as Dagster makes it: tables, revision, WAL"


def schema(home: Path, run_id: str) -> tuple:
    """A run's event database: its tables and indexes, its alembic revision and its journal mode."""
    with contextlib.closing(sqlite3.connect(home / "history" / "runs" / f"{run_id}.db")) as database:
        return (sorted(database.execute("SELECT type, name, sql FROM sqlite_master")), database.execute("SELECT * FROM alembic_version").fetchall(),
                database.execute("PRAGMA journal_mode").fetchall())
