"""The embedded instance (`assets/instance.py`): Dagster's SQLite storage in the same files, without an engine per query
or alembic's scripts read again for every run."""

import collections
import contextlib
import json
import os
import select
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, asset, materialize
from sqlalchemy import event
from sqlalchemy.pool import Pool

from assets.instance import FactoryInstance
from factory.cli.common import INSTANCE_CLASS_YAML, dagster_home

REPO = Path(__file__).resolve().parents[2]


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


def database_of(connection: sqlite3.Connection) -> Path:
    [(_, _, path)] = connection.execute("PRAGMA database_list").fetchall()
    return Path(path)


def test_each_database_is_opened_through_one_engine_and_connection_however_many_events_the_runs_store(home):
    engines: list[str] = []  # an engine's pool connects for the first time once: Dagster's made an engine for every query
    connections: collections.Counter[str] = collections.Counter()  # and Dagster's engines a connection for every query

    def first(connection, _record) -> None:
        if database_of(connection).is_relative_to(home):
            engines.append(database_of(connection).name)

    def connected(connection, _record) -> None:
        if database_of(connection).is_relative_to(home):
            connections[database_of(connection).name] += 1

    event.listen(Pool, "first_connect", first)
    event.listen(Pool, "connect", connected)
    try:
        with DagsterInstance.from_config(str(home)) as instance:
            assert isinstance(instance, FactoryInstance)
            before = len(engines)
            connections.clear()
            runs = [materialize([spoken, heard], instance=instance) for _ in range(3)]
            stored = sum(len(instance.all_logs(run.run_id)) for run in runs)
    finally:
        event.remove(Pool, "first_connect", first)
        event.remove(Pool, "connect", connected)
    assert all(run.success for run in runs) and stored > 60
    assert sorted(engines[before:]) == sorted(f"{run.run_id}.db" for run in runs), "one engine for each run's own database, none per query"
    assert {f"{run.run_id}.db": 1 for run in runs}.items() <= connections.items(), "a run's database is connected to once"
    assert max(connections.values()) <= 2, f"one connection kept per database (and one beside it while it is in use): {connections}"


def test_a_root_made_again_under_a_process_that_holds_it_open_is_read_anew(tmp_path, monkeypatch):
    """`rm -rf .factory` and a new run while a long-lived process (`factory ui`) holds the instance: its kept connections
    are to files no longer there, and it reads the new ones, as it would opening a connection for each query."""
    monkeypatch.delenv("FACTORY_DATABASE_URL", raising=False)
    root = tmp_path / "root"
    with DagsterInstance.from_config(str(dagster_home(root))) as holder:
        before = materialize([spoken], instance=holder)
        assert [run.run_id for run in holder.get_runs()] == [before.run_id]
        shutil.rmtree(root)
        with DagsterInstance.from_config(str(dagster_home(root))) as fresh:
            after = materialize([spoken], instance=fresh)
        assert [run.run_id for run in holder.get_runs()] == [after.run_id]
        assert holder.get_latest_materialization_event(AssetKey("spoken")).run_id == after.run_id


def test_a_forked_child_opens_connections_of_its_own(home):
    """A process forked after the instance was used (SQLite's locks belong to the process that opened a file) never uses
    its parent's kept connections: it opens its own, and reads what the parent wrote."""
    with DagsterInstance.from_config(str(home)) as instance:
        run = materialize([spoken], instance=instance)
        reading, writing = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: what it opened and what it read, on the pipe; then gone, whatever happened, without pytest's teardown
            try:
                opened: list[str] = []
                event.listen(Pool, "connect", lambda connection, _record: opened.append(database_of(connection).name))
                said = {"runs": [r.run_id for r in instance.get_runs()], "opened": opened}
                os.write(writing, json.dumps(said).encode())
            finally:
                os._exit(0)
        os.close(writing)
        with os.fdopen(reading) as pipe:
            assert select.select([pipe], [], [], 60)[0], "the forked child said nothing within a minute"
            said = json.loads(pipe.read() or "{}")
        assert os.waitpid(pid, 0)[1] == 0
    assert said, "the forked child failed before it said what it read"
    assert said["runs"] == [run.run_id]
    assert "runs.db" in said["opened"], "the child read the runs through a connection of its own"


def test_a_process_that_used_the_instance_leaves_no_write_ahead_log_as_it_exits(home):
    """Its kept connections are closed at exit: SQLite checkpoints each database's WAL into it and deletes it, as the last
    close of Dagster's own storage leaves it."""
    script = f"""
from dagster import DagsterInstance, asset, materialize
@asset
def one() -> int:
    return 1
instance = DagsterInstance.from_config({str(home)!r})
assert materialize([one], instance=instance).success
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (home / "history" / "runs.db").exists()
    assert not sorted(home.rglob("*-wal")), "every database's write-ahead log checkpointed and deleted"


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
