"""The source-code corpus: text files ingested into an Iceberg table with a deterministic split."""

from __future__ import annotations

import hashlib
import logging
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import EqualTo
from pyiceberg.schema import Schema
from pyiceberg.table import DataScan
from pyiceberg.types import LongType, NestedField, StringType

from factory.config.schema import DataConfig
from factory.errors import ArtifactError, ConfigError

SPLITS = ("train", "validation")
SCHEMA = Schema(
    NestedField(1, "path", StringType(), required=True),
    NestedField(2, "text", StringType(), required=True),
    NestedField(3, "bytes", LongType(), required=True),
    NestedField(4, "sha256", StringType(), required=True),
    NestedField(5, "split", StringType(), required=True),
)
ARROW_SCHEMA = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("text", pa.large_string(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
    ]
)


@dataclass(frozen=True, kw_only=True, slots=True)
class CorpusVersion:
    """One ingested snapshot of the corpus table."""

    table: str
    snapshot_id: int
    tag: str
    rows: dict[str, int]
    bytes: dict[str, int]
    content_sha256: str
    skipped: int


def stdlib_root() -> Path:
    """The running interpreter's standard library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(path: str, validation_percent: int) -> str:
    """Deterministic split by hash of the relative path: the same file always lands in the same split."""
    bucket = int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "big") % 100
    return "validation" if bucket < validation_percent else "train"


def source_files(root: Path, max_file_bytes: int) -> Iterator[Path]:
    """Non-empty `.py` files under root, in path order, without installed packages or caches."""
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if "site-packages" in parts or "dist-packages" in parts or "__pycache__" in parts:
            continue
        if path.is_file() and 0 < path.stat().st_size <= max_file_bytes:
            yield path


def read_corpus(root: Path, config: DataConfig, log: logging.Logger) -> pa.Table:
    """Read every source file under root into an Arrow table (undecodable files are skipped)."""
    columns: dict[str, list] = {name: [] for name in ARROW_SCHEMA.names}
    skipped = 0
    for path in source_files(root, config.max_file_bytes):
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            skipped += 1
            continue
        rel = path.relative_to(root).as_posix()
        columns["path"].append(rel)
        columns["text"].append(text)
        columns["bytes"].append(len(raw))
        columns["sha256"].append(hashlib.sha256(raw).hexdigest())
        columns["split"].append(split_of(rel, config.validation_percent))
    if skipped:
        log.info("skipped %d files that are not UTF-8", skipped)
    table = pa.Table.from_pydict(columns, schema=ARROW_SCHEMA)
    return table.replace_schema_metadata({"skipped": str(skipped)})


def ingest(catalog: Catalog, config: DataConfig, log: logging.Logger, root: Path | None = None) -> CorpusVersion:
    """Write the corpus as a new snapshot of `config.table`; older snapshots stay readable."""
    root = root or stdlib_root()
    if not root.is_dir():
        raise ConfigError(f"data.source: {root} is not a directory")
    data = read_corpus(root, config, log)
    if data.num_rows == 0:
        raise ConfigError(f"data.source: no .py files under {root} (max_file_bytes={config.max_file_bytes})")
    namespace, _ = config.table.split(".")
    catalog.create_namespace_if_not_exists(namespace)
    table = catalog.create_table_if_not_exists(config.table, schema=SCHEMA)
    listing = (f"{path}\0{digest}" for path, digest in zip(data["path"].to_pylist(), data["sha256"].to_pylist(), strict=True))
    content = hashlib.sha256("\n".join(listing).encode()).hexdigest()
    tag = content_tag(content)
    snapshot = table.snapshot_by_name(tag)
    if snapshot is None:  # these bytes are not in the table yet: write them and tag the snapshot by content
        if table.current_snapshot() is None:
            table.append(data)
        else:
            table.overwrite(data)
        snapshot = table.current_snapshot()
        assert snapshot is not None, "a write always makes a snapshot"
        table.manage_snapshots().create_tag(snapshot.snapshot_id, tag).commit()
    rows = {split: 0 for split in SPLITS}
    sizes = {split: 0 for split in SPLITS}
    for split, size in zip(data["split"].to_pylist(), data["bytes"].to_pylist(), strict=True):
        rows[split] += 1
        sizes[split] += size
    log.info("ingested %d files (%d bytes) into %s, snapshot %d", data.num_rows, sum(sizes.values()), config.table, snapshot.snapshot_id)
    return CorpusVersion(
        table=config.table,
        snapshot_id=snapshot.snapshot_id,
        tag=tag,
        rows=rows,
        bytes=sizes,
        content_sha256=content,
        skipped=int(data.schema.metadata[b"skipped"]),
    )


def content_tag(content_sha256: str) -> str:
    """The Iceberg tag naming the snapshot that holds exactly this content."""
    return f"content-{content_sha256[:16]}"


def resolve_tag(catalog: Catalog, table: str, tag: str) -> int:
    """The snapshot id a tag points at; a clear error when the catalog lost it."""
    try:
        snapshot = catalog.load_table(table).snapshot_by_name(tag)
    except NoSuchTableError as e:
        raise ArtifactError(f"Iceberg table {table} is gone from the catalog; remove .factory/registry (or rerun with a new root) to rebuild the corpus") from e
    if snapshot is None:
        raise ArtifactError(f"Iceberg table {table} has no snapshot tagged {tag}; the catalog was reset, so rebuild the corpus")
    return snapshot.snapshot_id


def read_split(catalog: Catalog, table: str, snapshot_id: int, split: str, columns: tuple[str, ...] = ("path", "text")) -> pa.Table:
    """One split of one snapshot of the corpus, sorted by path."""
    fields = ("path", *(c for c in columns if c != "path"))
    return scan_split(catalog, table, snapshot_id, split, fields).to_arrow().sort_by("path")


def scan_split(catalog: Catalog, table: str, snapshot_id: int, split: str, fields: tuple[str, ...]) -> DataScan:
    """The Iceberg scan of some columns of one split of one snapshot."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}")
    return catalog.load_table(table).scan(row_filter=EqualTo("split", split), selected_fields=fields, snapshot_id=snapshot_id)
