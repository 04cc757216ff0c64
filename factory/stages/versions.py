"""Runner support of the data kinds (raw, deduped and filtered datasets, blend): the table versions a stage reads and publishes.

Imported by their run functions only (it loads pyiceberg and pyarrow): reading the stage registry never imports it.
A dataset stage writes one Iceberg version per dataset and `datasets.json`, which names the versions by content tag,
so the same bytes give the same artifact.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from factory.data.catalog import open_catalog
from factory.data.tables import Rows, TableVersion, resolve, stream_version, version_schema
from factory.errors import StageFailed
from factory.registry.layout import DATASETS_FILE
from factory.runtime.context import StageContext


def load_versions(ctx: StageContext, stage: str) -> dict[str, TableVersion]:
    """The table versions an upstream data stage published, by dataset name (snapshot ids resolved again)."""
    records = json.loads((ctx.upstream(stage) / DATASETS_FILE).read_text())
    catalog = open_catalog(ctx.request.catalog)
    versions = {}
    for name, record in records.items():
        fields = {key: record[key] for key in ("table", "tag", "content_tag", "rows", "bytes")}
        versions[name] = TableVersion(**fields, snapshot_id=resolve(catalog, record["table"], record["content_tag"]))
    return versions


def publish_versions(ctx: StageContext, versions: dict[str, TableVersion], stats: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Write `datasets.json` and return the flat summary shown on the materialization."""
    records = {name: {**{k: v for k, v in asdict(version).items() if k != "snapshot_id"}, **stats[name]} for name, version in versions.items()}
    (ctx.out / DATASETS_FILE).write_text(json.dumps(records, indent=2, sort_keys=True))
    summary: dict[str, Any] = {}
    for name, version in versions.items():
        summary[f"{name}/table"] = version.ref
        summary[f"{name}/snapshot_id"] = version.snapshot_id
        summary[f"{name}/rows"] = version.rows
        summary[f"{name}/bytes"] = version.bytes
        summary.update({f"{name}/{key}": value for key, value in stats[name].items()})
    return summary


@dataclass(frozen=True, kw_only=True, slots=True)
class Upstream:
    """One dataset's upstream version, read as passes over record batches (never whole), in its file order."""

    columns: tuple[str, ...]
    """Every column of the version (the record columns its source keeps too)."""
    rows: int
    read: Callable[[tuple[str, ...]], Iterator[pa.RecordBatch]]
    """A pass over some columns."""

    def without(self, removed: set[str], keys: pa.Table) -> Rows:
        """The rows whose id is not in `removed` (`keys`: those of every row), to publish."""
        gone = pa.array(list(removed), keys.schema.field("id").type)

        def kept(batch: pa.RecordBatch | pa.Table) -> pa.Array:
            return pc.invert(pc.is_in(batch["id"], value_set=gone))

        return Rows(keys=keys.filter(kept(keys)), column_names=self.columns,
                    batches=lambda: (batch.filter(kept(batch)) for batch in self.read(self.columns)))


def transform(
    ctx: StageContext, upstream: str, step: Callable[[str, Upstream], tuple[Rows, dict[str, Any]]], publish: Callable[[str, Rows], TableVersion],
) -> dict[str, Any]:
    """Read each dataset's upstream version, apply `step`, and `publish` the rows it keeps as a version: a record batch of the
    upstream in memory at a time, and what the step keeps of every row (ids, hashes)."""
    catalog = open_catalog(ctx.request.catalog)
    versions, stats = {}, {}
    for name, source in load_versions(ctx, upstream).items():
        table = catalog.load_table(source.table)
        columns = tuple(field.name for field in version_schema(table, source.snapshot_id).fields)  # with the kept record columns

        def read(selected: tuple[str, ...], source: TableVersion = source) -> Iterator[pa.RecordBatch]:
            return stream_version(catalog, source.table, source.snapshot_id, selected)

        rows, stats[name] = step(name, Upstream(columns=columns, rows=source.rows, read=read))
        versions[name] = publish(name, rows)
    return publish_versions(ctx, versions, stats)


def dataset_version(ctx: StageContext, stage: str, name: str) -> str:
    """`table@content-tag` of the version an upstream data stage published for dataset `name`: exactly the rows it wrote."""
    versions = load_versions(ctx, stage) if stage in ctx.request.spec.upstream else {}
    if name not in versions:
        raise StageFailed(f"{stage} wrote no version of dataset {name!r} (it wrote {', '.join(sorted(versions)) or 'none'})")
    return f"{versions[name].table}@{versions[name].content_tag}"

