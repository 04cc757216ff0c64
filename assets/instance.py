"""The embedded instance's class: Dagster's SQLite storage and local compute logs, the same files in the same places,
for a process that makes many short runs (`factory run` makes one per variant, evaluation batch, leaderboard and report).

Its storage keeps one SQLAlchemy engine per database file (the runs, the schedules, the event log's index and one per
run) for the process's life, where Dagster's makes an engine, with its dialect's checks and an empty cache of compiled
statements, for every query; each use still opens a connection of its own and closes it (NullPool, as Dagster's), so
nothing stays open in a process that forks or ends. A run's new database is stamped from alembic's scripts read once
per process. Its compute logs are `assets.compute_logs`'s. The dagster.yaml of the embedded default names it
(`factory.cli.common`); sections a user sets there (`storage`, `compute_logs`) win, and an instance on PostgreSQL is
Dagster's own. `bench/instance.py` measures it against Dagster's defaults.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import yaml
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef, compute_logs_directory
from dagster._core.storage.event_log.schema import SqlEventLogStorageMetadata
from dagster._core.storage.event_log.sqlite import sqlite_event_log
from dagster._core.storage.event_log.sqlite.sqlite_event_log import INDEX_SHARD_NAME, SqliteEventLogStorage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sql import create_engine, get_alembic_config
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._core.storage.sqlite_storage import DagsterSqliteStorage, _event_logs_directory, _runs_directory, _schedule_directory
from dagster._serdes import ConfigurableClassData
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DatabaseError as SQLAlchemyDatabaseError
from sqlalchemy.pool import NullPool

from assets.compute_logs import FactoryComputeLogs

RUN_ENGINES = 64
"""Engines kept for the event logs of separate runs (a database each), the least recently used let go first: a run's
process uses its own run's and the index's; the webserver pages through many."""
INIT_RETRIES = 10
INIT_RETRY_S = 0.2
CONCURRENT_INIT = re.compile(r"table \w+ already exists|database is locked|UNIQUE constraint failed: alembic_version")
"""What initialising a database meets when another process initialises it at that moment: retried after INIT_RETRY_S, as
Dagster's `_initdb` retries these (its list, which it keeps in its code)."""


class FactoryInstance(DagsterInstance):
    """A Dagster instance whose storage and compute logs default to the factory's; dagster.yaml names it as its
    `instance_class`."""

    @classmethod
    def config_schema(cls) -> dict:
        return {}  # no settings of its own: dagster.yaml's sections are Dagster's

    @classmethod
    def config_defaults(cls, base_dir: str) -> Mapping[str, ConfigurableClassData | None]:
        return {**InstanceRef.config_defaults(base_dir),
                "storage": ConfigurableClassData(__name__, FactorySqliteStorage.__name__, yaml.dump({"base_dir": base_dir})),
                "compute_logs": ConfigurableClassData(FactoryComputeLogs.__module__, FactoryComputeLogs.__name__,
                                                      yaml.dump({"base_dir": compute_logs_directory(base_dir)}))}


class Engines:
    """One engine per database URL, the `limit` most recently used kept."""

    def __init__(self, limit: int, **options: Any) -> None:
        self._limit, self._options = limit, options
        self._kept: collections.OrderedDict[str, Engine] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, url: str) -> Engine:
        with self._lock:
            engine = self._kept.get(url)
            if engine is None:
                engine = self._kept[url] = create_engine(url, poolclass=NullPool, **self._options)
                if len(self._kept) > self._limit:
                    self._kept.popitem(last=False)[1].dispose()
            self._kept.move_to_end(url)
            return engine

    def dispose(self) -> None:
        with self._lock:
            for engine in self._kept.values():
                engine.dispose()
            self._kept.clear()


@contextlib.contextmanager
def _transaction(engine: Engine) -> Iterator[Connection]:
    """A connection of its own, in a transaction committed when the block ends (rolled back if it raises)."""
    with engine.connect() as connection, connection.begin():
        yield connection


@functools.cache
def _migrations() -> ScriptDirectory:
    """Alembic's scripts of Dagster's storage, read once per process."""
    return ScriptDirectory.from_config(get_alembic_config(sqlite_event_log.__file__))


class FactoryEventLogStorage(SqliteEventLogStorage):
    """Dagster's event log on SQLite (an index database and one per run), each database's engine kept."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None) -> None:
        self._engines = Engines(RUN_ENGINES + 1, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS})
        super().__init__(base_dir, inst_data)

    @contextlib.contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        with self._db_lock:  # as Dagster's: one use at a time (its event log watcher is a thread of its own)
            engine = self._engines(self.conn_string_for_shard(shard))
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with _transaction(engine) as connection:
                yield connection

    def _initdb(self, engine: Engine, for_index_shard: bool = False) -> None:
        """A database without alembic's stamp (a run's, new) gets Dagster's tables, WAL and the head revision's stamp, as
        Dagster's `_initdb` gives it. A new index database (`for_index_shard`: what older ones lack is its business) is
        Dagster's to make."""
        if for_index_shard:
            super()._initdb(engine, for_index_shard=True)
            return
        for retry in range(INIT_RETRIES + 1):
            try:
                with engine.connect() as connection:
                    migration = MigrationContext.configure(connection)
                    if migration.get_current_revision() is None:
                        SqlEventLogStorageMetadata.create_all(connection)
                        connection.execute(text("PRAGMA journal_mode=WAL;"))
                        migration.stamp(_migrations(), "head")
                        connection.commit()
                return
            except (SQLAlchemyDatabaseError, sqlite3.DatabaseError) as e:
                if retry == INIT_RETRIES or not CONCURRENT_INIT.search(str(e)):
                    raise
                time.sleep(INIT_RETRY_S)

    def has_table(self, table_name: str) -> bool:
        engine = self._engines(self.conn_string_for_shard(INDEX_SHARD_NAME))
        with engine.connect() as connection:
            return bool(engine.dialect.has_table(connection, table_name))

    def dispose(self) -> None:
        super().dispose()
        self._engines.dispose()


class _KeptEngine:
    """A storage whose every connection is to one database (`_conn_string`), through one engine it keeps."""

    _conn_string: str

    def __init__(self, conn_string: str, inst_data: ConfigurableClassData | None = None) -> None:
        self._engines = Engines(1)
        super().__init__(conn_string, inst_data)

    @contextlib.contextmanager
    def connect(self) -> Iterator[Connection]:
        with _transaction(self._engines(self._conn_string)) as connection:
            yield connection

    def dispose(self) -> None:
        super().dispose()
        self._engines.dispose()


class FactoryRunStorage(_KeptEngine, SqliteRunStorage):
    """Dagster's run storage on SQLite, its engine kept."""


class FactoryScheduleStorage(_KeptEngine, SqliteScheduleStorage):
    """Dagster's schedule storage on SQLite (the sensors' cursors and ticks), its engine kept."""


class FactorySqliteStorage(DagsterSqliteStorage):
    """Dagster's SQLite storage (runs, event logs, schedules: the same files in the same directories) over kept engines."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None) -> None:
        # Dagster's __init__ would open its own three storages first: these take their place, in the same directories.
        super(DagsterSqliteStorage, self).__init__()
        self.base_dir = base_dir
        self._inst_data = inst_data
        self._run_storage = FactoryRunStorage.from_local(_runs_directory(base_dir))
        self._event_log_storage = FactoryEventLogStorage(_event_logs_directory(base_dir))
        self._schedule_storage = FactoryScheduleStorage.from_local(_schedule_directory(base_dir))

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Any) -> FactorySqliteStorage:
        return cls.from_local(inst_data=inst_data, **config_value)
