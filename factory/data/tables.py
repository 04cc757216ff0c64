"""Versioned dataset tables: every version an Iceberg snapshot, tagged `v<n>` (or a name) and by content.

A version is written once. Writing bytes the table already holds reuses that snapshot, so the
same data never becomes two versions; a tag, once it names a snapshot, names it forever. Old
versions stay readable by tag (time travel). A snapshot its checks refused is tagged
`rejected-<content>` instead of a name, so names (and the pins that use them) only ever reach
data that passed.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, ValidationException
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.utils.concurrent import ExecutorFactory

from factory.data.documents import COLUMNS, document_schemas, kept_columns
from factory.errors import ArtifactError, ConfigError

VERSION_TAG = re.compile(r"^v(\d+)$")
CONTENT_PREFIX = "content-"
REJECTED_PREFIX = "rejected-"
COMMIT_ATTEMPTS = 10
T = TypeVar("T")
# Another writer committed between our read and our commit: reload the table and publish again.
# (A replaced version is never lost: its tags keep its snapshot readable.)
CONFLICTS = (CommitFailedException, ValidationException)
KEY_COLUMNS = ("id", "sha256", "bytes")
"""The columns a version's content tag and counts come from."""
WRITE_PROPERTIES = {"write.target-file-size-bytes": str(64 << 20)}
"""A table's write properties (set when it is created, or at its next write when it lacks them): pyiceberg gathers the
batches of one data file in memory before it writes the file, so its target (in Arrow's bytes; the Parquet file is a few
times smaller) bounds what a streamed write holds: about `writers()` + 2 files of 64 MB, not of pyiceberg's 512 MB."""
WRITERS = 4
"""Data files written at once by default, and no more than the cores this process may run on (pyiceberg's `max-workers`
overrides): each holds up to the target size. On 2 cores 2 writers write the 4x corpus of bench/data.py's memory
measure faster than 4 (2.0-2.3 s against 2.7-2.8 s) in about half the memory (Arrow's 0.6 GB against 1.1 GB)."""
BATCH_ROWS = 16_384
"""Rows of a record batch read from a version: what a stage that streams holds of it at once."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Rows:
    """A version's rows as passes over record batches, never held whole: what a stage that streams publishes."""

    keys: pa.Table
    """`id`, `sha256` and `bytes` of every row, in the order `batches` yields them: the version's content tag and counts."""
    column_names: tuple[str, ...]
    """The batches' columns."""
    batches: Callable[[], Iterator[pa.RecordBatch]]
    """A fresh pass over the rows each call (a commit that lost to another writer writes them again)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TableVersion:
    """One version of a dataset table."""

    table: str
    snapshot_id: int
    tag: str
    """The human name of the version: `v<n>` or the name the config gave (`rejected-<sha>` when its checks refused it)."""
    content_tag: str
    """`content-<sha>`: the tag that names these exact bytes."""
    rows: int
    bytes: int

    @property
    def ref(self) -> str:
        """`namespace.table@tag`, as configs pin it."""
        return f"{self.table}@{self.tag}"


def keys_of(batches: Iterable[pa.RecordBatch]) -> pa.Table:
    """`KEY_COLUMNS` of every row of `batches`, as one table."""
    parts = [pa.Table.from_batches([batch.select(list(KEY_COLUMNS))]) for batch in batches]
    return pa.concat_tables(parts) if parts else pa.table({"id": pa.array([], pa.string()), "sha256": pa.array([], pa.string()),
                                                           "bytes": pa.array([], pa.int64())})


def content_sha256(documents: pa.Table) -> str:
    """Hash of a table's documents, independent of row order: sorted (id, sha256) pairs."""
    pairs = sorted(zip(documents["id"].to_pylist(), documents["sha256"].to_pylist(), strict=True))
    return hashlib.sha256("\n".join(f"{i}\0{s}" for i, s in pairs).encode()).hexdigest()


def content_tag(sha: str) -> str:
    """The Iceberg tag naming the snapshot that holds exactly this content."""
    return f"{CONTENT_PREFIX}{sha[:16]}"


def parse_ref(ref: str) -> tuple[str, str]:
    """`namespace.table@tag` -> (table, tag)."""
    table, sep, tag = ref.partition("@")
    if not sep or not tag or table.count(".") != 1:
        raise ConfigError(f"expected 'namespace.table@tag', found {ref!r}")
    return table, tag


def ensure_namespace(catalog: Catalog, name: str) -> None:
    """Create the namespace unless it exists; another process creating it at the same moment is no error (the SQL
    catalog checks, then inserts: the second insert of two concurrent ones fails on the key)."""
    from sqlalchemy.exc import IntegrityError

    try:
        catalog.create_namespace_if_not_exists(name)
    except IntegrityError:
        if not catalog.namespace_exists(name):
            raise


def write_version(
    catalog: Catalog, table_name: str, documents: pa.Table | Rows, log: logging.Logger, tag: str | None = None, schema: pa.Schema | None = None
) -> TableVersion:
    """Publish `documents` as a version of `table_name` (creating it), named `tag` or `v<n>`; identical content reuses its snapshot.

    Rows are documents (with the record columns their source keeps) unless `schema` says otherwise; any schema needs the
    `id`, `sha256` and `bytes` columns.
    """
    return name_version(catalog, write_content(catalog, table_name, documents, schema), log, tag)


def write_content(catalog: Catalog, table_name: str, documents: pa.Table | Rows, schema: pa.Schema | None = None) -> TableVersion:
    """Publish `documents` as a snapshot tagged by content only: a version without a name yet (checks decide whether it
    gets one). A table is written sorted by id; `Rows` stream in the order they come (a stage that streams keeps its
    input's, which this wrote sorted), a batch in memory at a time."""
    arrow, iceberg = (schema, schema) if schema is not None else document_schemas(kept_columns(list(documents.column_names)))
    if isinstance(documents, Rows):
        keys = documents.keys
        rows = documents

        def data() -> pa.RecordBatchReader:
            return pa.RecordBatchReader.from_batches(arrow, (batch.select(list(arrow.names)).cast(arrow) for batch in rows.batches()))
    else:
        keys = documents = documents.select(list(arrow.names)).cast(arrow).sort_by("id")
        data = documents
    sha = content_sha256(keys)
    ensure_namespace(catalog, table_name.split(".")[0])
    table = catalog.create_table_if_not_exists(table_name, schema=iceberg, properties=WRITE_PROPERTIES)
    if not WRITE_PROPERTIES.items() <= table.properties.items():  # a table made before these properties
        table = _committed(catalog, table_name, table, _with_write_properties)
    snapshot_id = _committed(catalog, table_name, table, lambda t: _write(t, data, sha))
    return TableVersion(
        table=table_name, snapshot_id=snapshot_id, tag=content_tag(sha), content_tag=content_tag(sha), rows=keys.num_rows,
        bytes=int(pa.compute.sum(keys["bytes"]).as_py() or 0),
    )


def name_version(catalog: Catalog, version: TableVersion, log: logging.Logger, tag: str | None = None) -> TableVersion:
    """Give a version its human name: `tag`, else the `v<n>` it already has, else the next `v<n>`."""
    named = replace(version, tag=_committed(catalog, version.table, catalog.load_table(version.table), lambda t: _name(t, version, tag)))
    log.info("%s: %d documents as %s (snapshot %d)", version.table, named.rows, named.ref, named.snapshot_id)
    return named


def reject_version(catalog: Catalog, version: TableVersion, log: logging.Logger) -> TableVersion:
    """Mark a version its checks refused `rejected-<content>`: it takes no `v<n>` and no configured name, so no pin reaches it."""
    tag = REJECTED_PREFIX + version.content_tag.removeprefix(CONTENT_PREFIX)
    _committed(catalog, version.table, catalog.load_table(version.table), lambda t: _tag(t, version.snapshot_id, tag))
    rejected = replace(version, tag=tag)
    log.warning("%s: %d documents as %s (snapshot %d): refused by its checks, so not a version", version.table, version.rows,
                rejected.ref, version.snapshot_id)
    return rejected


def _committed(catalog: Catalog, table_name: str, table: Table, commit: Callable[[Table], T]) -> T:
    """`commit(table)`, again on a reloaded table each time another writer committed first."""
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            return commit(table)
        except CONFLICTS as e:
            if attempt == COMMIT_ATTEMPTS - 1:
                raise ArtifactError(f"{table_name}: {COMMIT_ATTEMPTS} commits in a row lost to concurrent writers; run again") from e
            table = catalog.load_table(table_name)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _with_write_properties(table: Table) -> Table:
    with table.transaction() as transaction:
        transaction.set_properties(WRITE_PROPERTIES)
    return table


class _FilesInFlight(ThreadPoolExecutor):
    """pyiceberg's writer turns a stream into data files through its executor's `map`, which (before Python 3.14) submits
    every item at once, pulling the whole stream into memory before the first file is written. This `map` keeps at most
    `max_workers` items submitted ahead of the one whose result is next, so a streamed write holds that many files."""

    def map(self, fn: Callable[..., T], *iterables: Iterable[Any], timeout: float | None = None, chunksize: int = 1) -> Iterator[T]:
        return self._bounded(fn, zip(*iterables, strict=False), timeout)

    def _bounded(self, fn: Callable[..., T], items: Iterator[tuple[Any, ...]], timeout: float | None) -> Iterator[T]:
        ahead: collections.deque[Future[T]] = collections.deque()
        try:
            for item in items:
                ahead.append(self.submit(fn, *item))
                if len(ahead) > self._max_workers:
                    yield ahead.popleft().result(timeout)
            while ahead:
                yield ahead.popleft().result(timeout)
        finally:
            for future in ahead:
                future.cancel()


def _files_in_flight() -> None:
    """Give pyiceberg this process's `_FilesInFlight` (it keeps one executor per process: `ExecutorFactory`), with
    pyiceberg's `max-workers` setting, else `writers()` threads."""
    if ExecutorFactory._instance_pid != os.getpid() or not isinstance(ExecutorFactory._instance, _FilesInFlight):
        if ExecutorFactory._instance_pid == os.getpid() and ExecutorFactory._instance is not None:
            ExecutorFactory._instance.shutdown(wait=False)  # its threads end once idle; tasks it runs finish
        ExecutorFactory._instance_pid = os.getpid()
        ExecutorFactory._instance = _FilesInFlight(max_workers=ExecutorFactory.max_workers() or writers())


def writers() -> int:
    """How many data files a write makes at once by default: `WRITERS`, or fewer on a machine with fewer cores (those
    this process may run on: a container's CPU set, not the host's)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(WRITERS, cores))


def _write(table: Table, data: pa.Table | Callable[[], pa.RecordBatchReader], sha: str) -> int:
    by_content = content_tag(sha)
    snapshot = table.snapshot_by_name(by_content)
    if snapshot is None:
        _files_in_flight()
        documents = data if isinstance(data, pa.Table) else data()  # pyiceberg streams a reader, a file of batches at a time
        if table.current_snapshot() is None:
            table.append(documents, snapshot_properties={"content-sha256": sha})
        else:
            table.overwrite(documents, snapshot_properties={"content-sha256": sha})
        snapshot = table.current_snapshot()
        assert snapshot is not None, "a write always makes a snapshot"
        table.manage_snapshots().create_tag(snapshot.snapshot_id, by_content).commit()
    return snapshot.snapshot_id


def _name(table: Table, version: TableVersion, tag: str | None) -> str:
    if tag is not None:
        taken = table.snapshot_by_name(tag)
        if taken is not None and taken.snapshot_id != version.snapshot_id:
            raise ArtifactError(f"{version.table}@{tag} already names another version; tags are immutable, so set a new tag in the config")
        return _tag(table, version.snapshot_id, tag)
    if versions := sorted((t for t in _tags_of(table, version.snapshot_id) if VERSION_TAG.match(t)), key=lambda t: int(t[1:])):
        return versions[0]
    return _tag(table, version.snapshot_id, f"v{next_version(table)}")


def _tag(table: Table, snapshot_id: int, tag: str) -> str:
    """Tag a snapshot unless the tag already names it."""
    if tag not in _tags_of(table, snapshot_id):
        table.manage_snapshots().create_tag(snapshot_id, tag).commit()
    return tag


def _tags_of(table: Table, snapshot_id: int) -> list[str]:
    table.refresh()
    return [name for name, ref in table.refs().items() if ref.snapshot_id == snapshot_id and ref.snapshot_ref_type == "tag"]


def is_name(tag: str) -> bool:
    """Whether a tag names a version (`v<n>` or a configured name): not a content tag, nor a rejection."""
    return not tag.startswith((CONTENT_PREFIX, REJECTED_PREFIX))


def last_named(catalog: Catalog, table_name: str, excluding: int | None = None) -> str | None:
    """`table@name` of the newest snapshot with a name (other than `excluding`): the version its checks let through last."""
    try:
        table = catalog.load_table(table_name)
    except NoSuchTableError:
        return None
    names: dict[int, list[str]] = {}
    for tag, ref in table.refs().items():
        if ref.snapshot_ref_type == "tag" and is_name(tag) and ref.snapshot_id != excluding:
            names.setdefault(ref.snapshot_id, []).append(tag)
    if not names:
        return None

    def age(snapshot_id: int) -> tuple[int, int]:
        snapshot = table.snapshot_by_id(snapshot_id)
        return (snapshot.sequence_number or 0, snapshot.timestamp_ms) if snapshot is not None else (0, 0)

    newest = sorted(names[max(names, key=age)], key=lambda t: (not VERSION_TAG.match(t), int(t[1:]) if VERSION_TAG.match(t) else 0, t))
    return f"{table_name}@{newest[0]}"


def next_version(table: Table) -> int:
    """One more than the highest `v<n>` tag of the table."""
    numbers = [int(m.group(1)) for name in table.refs() if (m := VERSION_TAG.match(name))]
    return max(numbers, default=0) + 1


def resolve(catalog: Catalog, table_name: str, tag: str) -> int:
    """The snapshot id a tag names; a clear error when the table or the tag is not there."""
    try:
        table = catalog.load_table(table_name)
    except NoSuchTableError as e:
        raise ArtifactError(f"Iceberg table {table_name} does not exist in the catalog; ingest it first or fix the name") from e
    snapshot = table.snapshot_by_name(tag)
    if snapshot is None:
        tags = sorted(name for name, ref in table.refs().items() if ref.snapshot_ref_type == "tag" and is_name(name))
        raise ArtifactError(f"Iceberg table {table_name} has no version tagged {tag!r}; its tags: {', '.join(tags) or 'none'}")
    return snapshot.snapshot_id


def resolve_pin(catalog: Catalog, table_name: str, tag: str) -> int:
    """The snapshot a pinned `table@tag` names, refused when its checks rejected it and it never passed since."""
    snapshot_id = resolve(catalog, table_name, tag)
    tags = _tags_of(catalog.load_table(table_name), snapshot_id)
    if any(t.startswith(REJECTED_PREFIX) for t in tags) and not any(is_name(t) for t in tags):
        passed = last_named(catalog, table_name)
        raise ArtifactError(
            f"{table_name}@{tag} is a version its dataset checks rejected; pin "
            + (f"a version that passed, such as {passed}" if passed else "a version that passed (none has yet)")
        )
    return snapshot_id


def content_of(catalog: Catalog, ref: str) -> str:
    """What a `table@tag` holds in this catalog: the content tag of the snapshot it names (`snapshot-<id>` without one)."""
    table_name, tag = parse_ref(ref)
    snapshot_id = resolve(catalog, table_name, tag)
    table = catalog.load_table(table_name)
    contents = sorted(name for name, r in table.refs().items() if r.snapshot_id == snapshot_id and name.startswith("content-"))
    return contents[0] if contents else f"snapshot-{snapshot_id}"


def missing_refs(catalog: Catalog, refs: Iterable[str]) -> list[str]:
    """For each `table@tag` that cannot be read (or that its checks rejected), the reason (empty when all are good)."""
    return [problem for ref in refs for problem in version_problems(catalog, ref)]


def version_problems(catalog: Catalog, ref: str, columns: Iterable[str] = ()) -> list[str]:
    """Why `table@tag` cannot be read as a version that has `columns`, or was rejected by its checks (empty when it can be read)."""
    try:
        table_name, tag = parse_ref(ref)
        snapshot_id = resolve_pin(catalog, table_name, tag)
    except (ArtifactError, ConfigError) as e:
        return [str(e)]
    have = [field.name for field in version_schema(catalog.load_table(table_name), snapshot_id).fields]
    missing = [name for name in columns if name not in have]
    if not missing:
        return []
    return [f"{ref} has no column {', '.join(repr(name) for name in missing)} (it has {', '.join(have)}); "
            f"pin a version written with {', '.join(columns)}"]


def version_schema(table: Table, snapshot_id: int) -> Schema:
    """The schema a version of a table was written with."""
    snapshot = table.snapshot_by_id(snapshot_id)
    if snapshot is None or snapshot.schema_id is None:
        return table.schema()
    return table.schemas().get(snapshot.schema_id, table.schema())


def read_version(catalog: Catalog, table_name: str, snapshot_id: int, columns: tuple[str, ...] = COLUMNS) -> pa.Table:
    """One version of a table, whole, in id order."""
    fields = columns if "id" in columns else ("id", *columns)
    return catalog.load_table(table_name).scan(snapshot_id=snapshot_id, selected_fields=fields).to_arrow().sort_by("id").select(list(columns))


def stream_version(catalog: Catalog, table_name: str, snapshot_id: int, columns: tuple[str, ...]) -> Iterator[pa.RecordBatch]:
    """One version of a table, record batch by record batch, in the snapshot's file order."""
    yield from record_batches(catalog.load_table(table_name), snapshot_id, columns)


def record_batches(table: Table, snapshot_id: int, columns: tuple[str, ...]) -> Iterator[pa.RecordBatch]:
    """Record batches of some columns of a table version, in the snapshot's file order.

    Data files without delete files (every version this module writes) are read straight with
    pyarrow, which skips the scan machinery's per-batch overhead; anything else goes through
    pyiceberg's reader, which applies the deletes.
    """
    scan = table.scan(snapshot_id=snapshot_id, selected_fields=columns)
    tasks = list(scan.plan_files())
    if any(task.delete_files for task in tasks):
        yield from scan.to_arrow_batch_reader()
        return
    schema = version_schema(table, snapshot_id)
    field_ids = {c: schema.find_field(c).field_id for c in columns}
    for task in tasks:
        with table.io.new_input(task.file.file_path).open(seekable=True) as handle:  # the catalog's file IO: disk or S3
            parquet = pq.ParquetFile(handle)
            stored = _names_by_field_id(parquet.schema_arrow)  # Iceberg writes `my col` as `my_x20col`
            names = [stored.get(field_ids[c], c) for c in columns]
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=names):
                yield batch.rename_columns(list(columns)) if names != list(columns) else batch


def _names_by_field_id(schema: pa.Schema) -> dict[int, str]:
    """Top-level column names of a Parquet file by their Iceberg field id."""
    found = {}
    for field in schema:
        field_id = (field.metadata or {}).get(b"PARQUET:field_id")
        if field_id is not None:
            found[int(field_id)] = field.name
    return found
