"""The embedded instance's class: Dagster's SQLite storage and local compute logs, the same files in the same places,
for a process that makes many short runs (`factory run` makes one per variant, evaluation batch, leaderboard and report).

Its storage keeps one SQLAlchemy engine per database file (the runs, the schedules, the event log's index and one per
run) for the process's life, where Dagster's makes an engine, with its dialect's checks and an empty cache of compiled
statements, for every query; and each engine keeps one connection open between uses, where Dagster's opens one for
every query and closes it (NullPool): SQLite reads the database's header and maps its WAL index again at each open, and
at the last close checkpoints the WAL into the database and deletes it, about a millisecond each time, and a run stores
hundreds of events. What a kept connection must not do, it does not: a forked child never uses its parent's (each pool
is emptied in the child, unclosed), a database file replaced under its path is opened again (its inode is checked as a
connection is taken), and the process's connections are closed as it exits (the WAL checkpointed as Dagster's leave it).
A run's new database is stamped from alembic's scripts read once per process. Its compute logs are
`assets.compute_logs`'s. The dagster.yaml of the embedded default names it (`factory.cli.common`); sections a user sets
there (`storage`, `compute_logs`) win, and an instance on PostgreSQL is Dagster's own. `bench/instance.py` measures it
against Dagster's defaults.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import os
import re
import sqlite3
import threading
import time
import weakref
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
from sqlalchemy import event, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DatabaseError as SQLAlchemyDatabaseError
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.pool import QueuePool

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

    def dispose(self) -> None:
        super().dispose()
        if self._schedule_storage is not None:  # Dagster's disposes the run and event storage only: its kept connection too
            self._schedule_storage.dispose()


class Engines:
    """One engine per database URL, the `limit` most recently used kept, each keeping one connection open between uses
    (`kept_engine`)."""

    def __init__(self, limit: int, **options: Any) -> None:
        self._limit, self._options = limit, options
        self._kept: collections.OrderedDict[str, Engine] = collections.OrderedDict()
        self._lock = threading.Lock()
        _every.add(self)

    def __call__(self, url: str) -> Engine:
        with self._lock:
            engine = self._kept.get(url)
            if engine is None:
                engine = self._kept[url] = kept_engine(url, **self._options)
                if len(self._kept) > self._limit:
                    self._kept.popitem(last=False)[1].dispose()
            self._kept.move_to_end(url)
            return engine

    def dispose(self) -> None:
        with self._lock:
            for engine in self._kept.values():
                engine.dispose()
            self._kept.clear()

    def forget(self) -> None:
        """In a forked child: let every engine go without closing its connections, nor letting them be finalised (which
        closes them), its parent's. The lock is new: the child has no other thread, and a thread of the parent may have
        held it as it forked."""
        self._lock = threading.Lock()
        _parents.extend(engine.pool for engine in self._kept.values())
        for engine in self._kept.values():
            engine.dispose(close=False)
        self._kept.clear()


_every: weakref.WeakSet[Engines] = weakref.WeakSet()
"""Every `Engines` of this process: a forked child forgets their connections, and the process closes them as it exits."""
_parents: list[Any] = []
"""In a forked child, its parent's pools, kept from being finalised."""


def kept_engine(url: str, **options: Any) -> Engine:
    """An engine for the SQLite database at `url` that keeps one connection open between uses (more at once are opened
    and closed as needed), taken again only while the path still names the file it opened."""
    engine = create_engine(url, poolclass=QueuePool, pool_size=1, max_overflow=-1, **options)
    path = engine.url.database

    @event.listens_for(engine, "connect")
    def opened(_connection, record) -> None:
        record.info["inode"] = _inode(path)

    @event.listens_for(engine, "checkout")
    def taken(_connection, record, _proxy) -> None:
        if record.info.get("inode") != _inode(path):  # deleted, or replaced by another file: open what the path names now
            raise DisconnectionError(f"{path} is no longer the file this connection opened")

    return engine


def _inode(path: str | None) -> tuple[int, int] | None:
    try:
        stat = os.stat(path) if path else None
    except FileNotFoundError:
        return None
    return None if stat is None else (stat.st_dev, stat.st_ino)


def _forget_in_child() -> None:
    """In a forked child: the parent's connections are the parent's (SQLite's locks are per process), never used here."""
    for engines in list(_every):
        engines.forget()


def _close_at_exit() -> None:
    for engines in list(_every):
        engines.dispose()


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(_close_at_exit)


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
        self._tables: set[str] = set()
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
        """Whether the index database has the table; a table found is remembered (Dagster asks for every event it stores,
        often with a connection of its own open, which a second would then be opened and closed beside; nothing drops
        one, though a migration may add one)."""
        if table_name in self._tables:
            return True
        engine = self._engines(self.conn_string_for_shard(INDEX_SHARD_NAME))
        with engine.connect() as connection:
            found = bool(engine.dialect.has_table(connection, table_name))
        if found:
            self._tables.add(table_name)
        return found

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
