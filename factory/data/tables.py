"""Versioned dataset tables: every version an Iceberg snapshot, tagged `v<n>` (or a name) and by content.

A version is written once. Writing bytes the table already holds reuses that snapshot, so the
same data never becomes two versions; a tag, once it names a snapshot, names it forever. Old
versions stay readable by tag (time travel).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, ValidationException
from pyiceberg.table import Table

from factory.data.documents import ARROW_SCHEMA, COLUMNS, SCHEMA
from factory.errors import ArtifactError, ConfigError

VERSION_TAG = re.compile(r"^v(\d+)$")
COMMIT_ATTEMPTS = 10
# Another writer committed between our read and our commit: reload the table and publish again.
# (A replaced version is never lost: its tags keep its snapshot readable.)
CONFLICTS = (CommitFailedException, ValidationException)


@dataclass(frozen=True, kw_only=True, slots=True)
class TableVersion:
    """One version of a dataset table."""

    table: str
    snapshot_id: int
    tag: str
    """The human name of the version: `v<n>` or the name the config gave."""
    content_tag: str
    """`content-<sha>`: the tag that names these exact bytes."""
    rows: int
    bytes: int

    @property
    def ref(self) -> str:
        """`namespace.table@tag`, as configs pin it."""
        return f"{self.table}@{self.tag}"


def content_sha256(documents: pa.Table) -> str:
    """Hash of a table's documents, independent of row order: sorted (id, sha256) pairs."""
    pairs = sorted(zip(documents["id"].to_pylist(), documents["sha256"].to_pylist(), strict=True))
    return hashlib.sha256("\n".join(f"{i}\0{s}" for i, s in pairs).encode()).hexdigest()


def content_tag(sha: str) -> str:
    """The Iceberg tag naming the snapshot that holds exactly this content."""
    return f"content-{sha[:16]}"


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
    catalog: Catalog, table_name: str, documents: pa.Table, log: logging.Logger, tag: str | None = None, schema: pa.Schema | None = None
) -> TableVersion:
    """Publish `documents` as a version of `table_name` (creating it); identical content reuses its snapshot.

    Rows are documents unless `schema` says otherwise; any schema needs the `id`, `sha256` and `bytes` columns.
    """
    documents = documents.select(list(schema.names if schema else COLUMNS)).cast(schema or ARROW_SCHEMA).sort_by("id")
    sha = content_sha256(documents)
    ensure_namespace(catalog, table_name.split(".")[0])
    table = catalog.create_table_if_not_exists(table_name, schema=schema or SCHEMA)
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            version = _publish(table, table_name, documents, sha, tag)
            break
        except CONFLICTS as e:
            if attempt == COMMIT_ATTEMPTS - 1:
                raise ArtifactError(f"{table_name}: {COMMIT_ATTEMPTS} commits in a row lost to concurrent writers; run again") from e
            table = catalog.load_table(table_name)
    log.info("%s: %d documents as %s (snapshot %d)", table_name, version.rows, version.ref, version.snapshot_id)
    return version


def _publish(table: Table, name: str, documents: pa.Table, sha: str, tag: str | None) -> TableVersion:
    by_content = content_tag(sha)
    snapshot = table.snapshot_by_name(by_content)
    if snapshot is None:
        if table.current_snapshot() is None:
            table.append(documents, snapshot_properties={"content-sha256": sha})
        else:
            table.overwrite(documents, snapshot_properties={"content-sha256": sha})
        snapshot = table.current_snapshot()
        assert snapshot is not None, "a write always makes a snapshot"
        table.manage_snapshots().create_tag(snapshot.snapshot_id, by_content).commit()
    tags = _tags_of(table, snapshot.snapshot_id)
    if tag is not None:
        taken = table.snapshot_by_name(tag)
        if taken is not None and taken.snapshot_id != snapshot.snapshot_id:
            raise ArtifactError(f"{name}@{tag} already names another version; tags are immutable, so set a new tag in the config")
        if taken is None:
            table.manage_snapshots().create_tag(snapshot.snapshot_id, tag).commit()
        name_tag = tag
    elif versions := sorted((t for t in tags if VERSION_TAG.match(t)), key=lambda t: int(t[1:])):
        name_tag = versions[0]
    else:
        name_tag = f"v{next_version(table)}"
        table.manage_snapshots().create_tag(snapshot.snapshot_id, name_tag).commit()
    return TableVersion(
        table=name, snapshot_id=snapshot.snapshot_id, tag=name_tag, content_tag=by_content, rows=documents.num_rows,
        bytes=int(pa.compute.sum(documents["bytes"]).as_py() or 0),
    )


def _tags_of(table: Table, snapshot_id: int) -> list[str]:
    table.refresh()
    return [name for name, ref in table.refs().items() if ref.snapshot_id == snapshot_id and ref.snapshot_ref_type == "tag"]


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
        tags = sorted(name for name, ref in table.refs().items() if ref.snapshot_ref_type == "tag" and not name.startswith("content-"))
        raise ArtifactError(f"Iceberg table {table_name} has no version tagged {tag!r}; its tags: {', '.join(tags) or 'none'}")
    return snapshot.snapshot_id


def content_of(catalog: Catalog, ref: str) -> str:
    """What a `table@tag` holds in this catalog: the content tag of the snapshot it names (`snapshot-<id>` without one)."""
    table_name, tag = parse_ref(ref)
    snapshot_id = resolve(catalog, table_name, tag)
    table = catalog.load_table(table_name)
    contents = sorted(name for name, r in table.refs().items() if r.snapshot_id == snapshot_id and name.startswith("content-"))
    return contents[0] if contents else f"snapshot-{snapshot_id}"


def missing_refs(catalog: Catalog, refs: Iterable[str]) -> list[str]:
    """For each `table@tag` that cannot be read, the reason (empty when all exist)."""
    problems = []
    for ref in refs:
        try:
            resolve(catalog, *parse_ref(ref))
        except (ArtifactError, ConfigError) as e:
            problems.append(str(e))
    return problems


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
    for task in tasks:
        filesystem, path = pafs.FileSystem.from_uri(task.file.file_path)
        with filesystem.open_input_file(path) as handle:
            yield from pq.ParquetFile(handle).iter_batches(columns=list(columns))
