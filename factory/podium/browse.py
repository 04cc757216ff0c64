"""What Podium reads from the catalog: tables, snapshots, pages of rows, one row, diffs and SQL.

Snapshots are immutable, so a column of a snapshot, once read, is kept in memory (up to a byte
budget): a million-row table pages in milliseconds after its first load. A page reads only the
columns it shows, filters or sorts on. Filters and sorting are built from validated column names
and bound parameters; the SQL box (`factory.podium.sql`) runs one SELECT over a snapshot.
"""

from __future__ import annotations

import datetime
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.table import Table

from factory.data.tables import record_batches
from factory.podium.cells import preview
from factory.podium.errors import NotFound, PodiumError
from factory.podium.sql import SqlResult, connection, first_line
from factory.podium.worker import run_query

NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,127}$")
POSITION = "__row"
"""The column Podium adds: a row's position in its snapshot, which names the row in links."""
PAGE_SIZES = (25, 50, 100, 200)
PREVIEW_CHARS = 160
"""Characters of a string cell the table view shows."""
DIFF_ROWS = 100
CACHE_BYTES = 2 << 30
OPERATORS = {
    "contains": "contains({col}, ?)",
    "not contains": "NOT contains({col}, ?)",
    "=": "{col} = ?",
    "!=": "{col} != ?",
    "<": "{col} < ?",
    "<=": "{col} <= ?",
    ">": "{col} > ?",
    ">=": "{col} >= ?",
    "starts with": "starts_with({col}, ?)",
    "matches": "regexp_matches({col}, ?)",
    "is null": "{col} IS NULL",
    "is not null": "{col} IS NOT NULL",
}
UNARY = ("is null", "is not null")


@dataclass(frozen=True, kw_only=True, slots=True)
class Snapshot:
    """One snapshot of a table, with the tags and branches that name it."""

    id: int
    timestamp: datetime.datetime
    operation: str
    rows: int | None
    added: int | None
    deleted: int | None
    refs: tuple[str, ...]
    current: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class TableInfo:
    """A table's schema and its history."""

    name: str
    columns: tuple[tuple[str, str], ...]
    """(name, type) of each column."""
    snapshots: tuple[Snapshot, ...]
    """Newest first."""

    @property
    def rows(self) -> int | None:
        """Rows in the current snapshot (None when the table has none)."""
        current = next((s for s in self.snapshots if s.current), None)
        return current.rows if current else None

    def snapshot(self, ref: str | None) -> Snapshot:
        """The snapshot an id or a tag names; the current one when `ref` is empty."""
        if not self.snapshots:
            raise NotFound(f"{self.name} has no snapshots yet: nothing has been written to it")
        if not ref:
            return next(s for s in self.snapshots if s.current)
        for snapshot in self.snapshots:
            if ref == str(snapshot.id) or ref in snapshot.refs:
                return snapshot
        names = sorted({r for s in self.snapshots for r in s.refs if not r.startswith("content-")})
        raise NotFound(f"{self.name} has no snapshot, tag or branch {ref!r}; it has: {', '.join(names) or 'none'}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Filter:
    """One condition of the table view: `column operator value`."""

    column: str
    operator: str
    value: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class PageQuery:
    """Which rows and columns a table page shows."""

    columns: tuple[str, ...] = ()
    """Shown columns; empty means all."""
    filters: tuple[Filter, ...] = ()
    sort: str = ""
    descending: bool = False
    offset: int = 0
    size: int = 50


@dataclass(frozen=True, kw_only=True, slots=True)
class Page:
    """A page of rows: string cells cut to a preview, with their full lengths."""

    columns: tuple[str, ...]
    rows: list[dict[str, Any]]
    """Each row: POSITION, then the shown columns as `cells.preview` gives them (text cut to PREVIEW_CHARS)."""
    matched: int
    """Rows that pass the filters."""
    total: int
    query: PageQuery


@dataclass(frozen=True, kw_only=True, slots=True)
class Diff:
    """Rows in one snapshot and not the other (as multisets of whole rows)."""

    columns: tuple[str, ...]
    added: list[dict[str, Any]]
    removed: list[dict[str, Any]]
    added_count: int
    removed_count: int
    dropped_columns: tuple[str, ...] = ()
    """Columns only one side has, left out of the comparison."""


class ColumnCache:
    """Columns of snapshots already read, least recently used dropped first beyond `max_bytes`."""

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._columns: OrderedDict[tuple[str, int, str], pa.ChunkedArray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, table: str, snapshot: int, column: str) -> pa.ChunkedArray | None:
        """A cached column, or None."""
        with self._lock:
            key = (table, snapshot, column)
            if key in self._columns:
                self._columns.move_to_end(key)
            return self._columns.get(key)

    def put(self, table: str, snapshot: int, column: str, values: pa.ChunkedArray) -> None:
        """Keep a column; the oldest go while the cache holds more than `max_bytes` (the newest always stays)."""
        with self._lock:
            if (old := self._columns.pop((table, snapshot, column), None)) is not None:
                self._bytes -= old.nbytes
            self._columns[(table, snapshot, column)] = values
            self._bytes += values.nbytes
            while len(self._columns) > 1 and self._bytes > self.max_bytes:
                self._bytes -= self._columns.popitem(last=False)[1].nbytes

    def keys(self) -> list[tuple[str, int, str]]:
        """(table, snapshot, column) of every cached column, oldest first."""
        with self._lock:
            return list(self._columns)


def check_name(name: str, what: str) -> str:
    """A namespace or table name from a URL: letters, digits, `_` and `-` only."""
    if not NAME.match(name):
        raise NotFound(f"{what} {name!r} is not a valid name: use letters, digits, '_' and '-'")
    return name


class Browser:
    """Read-only views of an Iceberg catalog's tables."""

    def __init__(self, catalog: Catalog, cache: ColumnCache | None = None) -> None:
        self.catalog = catalog
        self.cache = cache or ColumnCache()
        self._readers: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    # --- the catalog -------------------------------------------------------------------------
    def namespaces(self) -> list[str]:
        """Every namespace, sorted."""
        return sorted(".".join(ns) for ns in self.catalog.list_namespaces())

    def tables(self, namespace: str) -> list[str]:
        """`namespace.table` names in a namespace."""
        check_name(namespace, "namespace")
        try:
            return sorted(".".join(ident) for ident in self.catalog.list_tables(namespace))
        except NoSuchNamespaceError as e:
            raise NotFound(f"there is no namespace {namespace!r}") from e

    def load(self, name: str) -> Table:
        """The table `namespace.table`, from a validated name."""
        namespace, sep, table = name.partition(".")
        if not sep:
            raise NotFound(f"{name!r} is not a table name: expected 'namespace.table'")
        check_name(namespace, "namespace")
        check_name(table, "table")
        try:
            return self.catalog.load_table(name)
        except NoSuchTableError as e:
            raise NotFound(f"there is no table {name}") from e
        except (OSError, ValueError) as e:
            raise PodiumError(f"{name} cannot be read: {e}") from e

    def info(self, name: str) -> TableInfo:
        """A table's columns and snapshots."""
        table = self.load(name)
        refs: dict[int, list[str]] = {}
        for ref_name, ref in table.refs().items():
            refs.setdefault(ref.snapshot_id, []).append(ref_name)
        current = table.current_snapshot()
        snapshots = []
        for snapshot in table.snapshots():
            summary = snapshot.summary.additional_properties if snapshot.summary else {}
            snapshots.append(Snapshot(
                id=snapshot.snapshot_id,
                timestamp=datetime.datetime.fromtimestamp(snapshot.timestamp_ms / 1000, tz=datetime.UTC),
                operation=str(snapshot.summary.operation.value) if snapshot.summary else "",
                rows=_int(summary.get("total-records")), added=_int(summary.get("added-records")),
                deleted=_int(summary.get("deleted-records")),
                refs=tuple(sorted(refs.get(snapshot.snapshot_id, []), key=lambda r: (r.startswith("content-"), r))),
                current=current is not None and snapshot.snapshot_id == current.snapshot_id,
            ))
        snapshots.sort(key=lambda s: (s.timestamp, s.id), reverse=True)
        columns = tuple((f.name, str(f.field_type)) for f in table.schema().fields)
        return TableInfo(name=name, columns=columns, snapshots=tuple(snapshots))

    # --- reading -----------------------------------------------------------------------------
    def columns(self, name: str, snapshot: int, columns: Sequence[str]) -> pa.Table:
        """Some columns of a snapshot, plus POSITION, read once and then served from memory."""
        with self._reader(name):  # a second request for the same table waits for the first's read
            found = {c: v for c in columns if (v := self.cache.get(name, snapshot, c)) is not None}
            missing = [c for c in columns if c not in found]
            if missing:
                try:
                    batches = list(record_batches(self.load(name), snapshot, tuple(missing)))
                    read = pa.Table.from_batches(batches) if batches else None
                except (OSError, ValueError) as e:
                    raise PodiumError(f"{name} (snapshot {snapshot}) cannot be read: {e}") from e
                for column in missing:
                    values = _one_chunk(read.column(column)) if read is not None else pa.chunked_array([], pa.null())
                    self.cache.put(name, snapshot, column, values)
                    found[column] = values
        rows = len(found[columns[0]]) if columns else 0
        arrays = [found[c] for c in columns] + [pa.array(np.arange(rows, dtype=np.int64))]
        return pa.Table.from_arrays(arrays, names=[*columns, POSITION])

    def _reader(self, name: str) -> threading.Lock:
        with self._guard:
            return self._readers.setdefault(name, threading.Lock())

    def columns_at(self, name: str, snapshot: int) -> tuple[tuple[str, str], ...]:
        """(name, type) of each column as the snapshot was written (an older snapshot may predate a column)."""
        table = self.load(name)
        found = table.snapshot_by_id(snapshot)
        if found is None:
            raise NotFound(f"{name} has no snapshot {snapshot}")
        schema = table.schemas().get(found.schema_id) if found.schema_id is not None else None
        return tuple((f.name, str(f.field_type)) for f in (schema or table.schema()).fields)

    def page(self, name: str, snapshot: int, query: PageQuery) -> Page:
        """One page of a snapshot's rows, filtered and sorted.

        Only the filter and sort columns go through DuckDB, to find the page's row positions; the
        shown columns are then taken for those rows alone, so a deep page costs what the first does.
        """
        known = [c for c, _ in self.columns_at(name, snapshot)]
        shown = tuple(query.columns) or tuple(known)
        keys = list(dict.fromkeys([*(f.column for f in query.filters), *([query.sort] if query.sort else [])]))
        for column in (*shown, *keys):
            if column not in known:
                raise PodiumError(f"{name} has no column {column!r}; its columns: {', '.join(known)}")
        data = self.columns(name, snapshot, list(dict.fromkeys([*shown, *keys])))
        if keys:
            where, params = _where(query.filters, data.schema)
            order = f'{_quote(query.sort)} {"DESC" if query.descending else "ASC"} NULLS LAST, ' if query.sort else ""
            with connection() as con:
                con.register("t", data.select([*keys, POSITION]))
                try:
                    matched = con.execute(f"SELECT count(*) FROM t {where}", params).fetchone()[0]
                    found = con.execute(f"SELECT {POSITION} FROM t {where} ORDER BY {order}{POSITION} LIMIT ? OFFSET ?",
                                        [*params, query.size, query.offset]).fetchall()
                except duckdb.Error as e:
                    raise PodiumError(f"the filters cannot be applied ({first_line(e)}); check each value against its column's type") from e
            positions = [p for (p,) in found]
        else:
            matched = data.num_rows
            positions = list(range(min(query.offset, matched), min(query.offset + query.size, matched)))
        picked = data.select(list(shown)).take(pa.array(positions, pa.int64())).to_pylist()
        rows = [{POSITION: p, **{c: preview(v, PREVIEW_CHARS) for c, v in row.items()}} for p, row in zip(positions, picked, strict=True)]
        return Page(columns=shown, rows=rows, matched=matched, total=data.num_rows, query=query)

    def row(self, name: str, snapshot: int, position: int) -> dict[str, Any]:
        """Every column of one row, whole."""
        columns = [c for c, _ in self.columns_at(name, snapshot)]
        data = self.columns(name, snapshot, columns)
        if not 0 <= position < data.num_rows:
            raise NotFound(f"{name} (snapshot {snapshot}) has {data.num_rows} rows; there is no row {position}")
        return {c: data.column(c)[position].as_py() for c in columns}

    def diff(self, name: str, before: int, after: int, limit: int = DIFF_ROWS) -> Diff:
        """Rows added and removed between two snapshots, compared as whole rows."""
        old = [c for c, _ in self.columns_at(name, before)]
        new = [c for c, _ in self.columns_at(name, after)]
        common = [c for c in new if c in old]
        a, b = self.columns(name, before, common), self.columns(name, after, common)
        listed = ", ".join(_quote(c) for c in common)
        with connection() as con:
            con.register("a", a.select(common))
            con.register("b", b.select(common))
            added_q = f"SELECT {listed} FROM b EXCEPT ALL SELECT {listed} FROM a"
            removed_q = f"SELECT {listed} FROM a EXCEPT ALL SELECT {listed} FROM b"
            added_count = con.execute(f"SELECT count(*) FROM ({added_q})").fetchone()[0]
            removed_count = con.execute(f"SELECT count(*) FROM ({removed_q})").fetchone()[0]
            added = _previews(con.execute(f"{added_q} LIMIT ?", [limit]))
            removed = _previews(con.execute(f"{removed_q} LIMIT ?", [limit]))
        return Diff(columns=tuple(common), added=added, removed=removed, added_count=added_count, removed_count=removed_count,
                    dropped_columns=tuple(sorted({*old, *new} - set(common))))

    def sql(
        self, name: str, snapshot: int, text: str, params: Sequence[Any] | Mapping[str, Any] = (), **limits: Any
    ) -> SqlResult:
        """Run one SELECT over the snapshot, seen as table `t` (and by its short name), in a worker process; `limits` as `run_query`'s."""
        data = self.columns(name, snapshot, [c for c, _ in self.columns_at(name, snapshot)]).drop_columns([POSITION])
        return run_query({"t": data, name.split(".", 1)[1]: data}, text, params, **limits)


def _quote(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _one_chunk(values: pa.ChunkedArray) -> pa.ChunkedArray:
    """The column as one chunk, so taking a page's rows does not copy it; kept as read when it does not fit one."""
    try:
        return pa.chunked_array([values.combine_chunks()])
    except (pa.ArrowInvalid, pa.ArrowCapacityError):
        return values


def _where(filters: Sequence[Filter], schema: pa.Schema) -> tuple[str, list[Any]]:
    clauses, params = [], []
    for item in filters:
        template = OPERATORS.get(item.operator)
        if template is None:
            raise PodiumError(f"unknown filter operator {item.operator!r}; use one of: {', '.join(OPERATORS)}")
        kind = schema.field(item.column).type
        if item.operator in ("contains", "not contains", "starts with", "matches") and not _is_text(kind):
            clauses.append(template.format(col=f"CAST({_quote(item.column)} AS VARCHAR)"))
        else:
            clauses.append(template.format(col=_quote(item.column)))
        if item.operator not in UNARY:
            params.append(_typed(item, kind))
    return ("WHERE " + " AND ".join(clauses), params) if clauses else ("", params)


def _typed(item: Filter, kind: pa.DataType) -> Any:
    """A filter's value as the column's type, so comparisons are numeric where the column is."""
    if item.operator in ("contains", "not contains", "starts with", "matches"):
        return item.value
    try:
        if pa.types.is_integer(kind):
            return int(item.value)
        if pa.types.is_floating(kind):
            return float(item.value)
        if pa.types.is_boolean(kind):
            return {"true": True, "false": False}[item.value.strip().lower()]
    except (ValueError, KeyError) as e:
        raise PodiumError(f"filter on {item.column}: {item.value!r} is not a {kind} value") from e
    return item.value


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def _previews(cursor: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    names = [d[0] for d in cursor.description]
    return [{n: preview(v, PREVIEW_CHARS) for n, v in zip(names, values, strict=True)} for values in cursor.fetchall()]
