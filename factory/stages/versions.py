"""Runner support of the data kinds (raw, deduped and filtered datasets, blend): the table versions a stage reads and publishes.

Imported by their run functions only (it loads pyiceberg and pyarrow): reading the stage registry never imports it.
A dataset stage writes one Iceberg version per dataset and `datasets.json`, which names the versions by content tag,
so the same bytes give the same artifact.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import pyarrow as pa

from factory.data.catalog import open_catalog
from factory.data.tables import TableVersion, read_version, resolve, version_schema
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


def transform(
    ctx: StageContext, upstream: str, step: Callable[[str, pa.Table], tuple[pa.Table, dict[str, Any]]],
    publish: Callable[[str, pa.Table], TableVersion],
) -> dict[str, Any]:
    """Read each dataset's upstream version, apply `step`, and `publish` the result as a version."""
    catalog = open_catalog(ctx.request.catalog)
    versions, stats = {}, {}
    for name, source in load_versions(ctx, upstream).items():
        table = catalog.load_table(source.table)
        columns = tuple(field.name for field in version_schema(table, source.snapshot_id).fields)  # with the kept record columns
        documents, stats[name] = step(name, read_version(catalog, source.table, source.snapshot_id, columns))
        versions[name] = publish(name, documents)
    return publish_versions(ctx, versions, stats)


def dataset_version(ctx: StageContext, stage: str, name: str) -> str:
    """`table@content-tag` of the version an upstream data stage published for dataset `name`: exactly the rows it wrote."""
    versions = load_versions(ctx, stage) if stage in ctx.request.spec.upstream else {}
    if name not in versions:
        raise StageFailed(f"{stage} wrote no version of dataset {name!r} (it wrote {', '.join(sorted(versions)) or 'none'})")
    return f"{versions[name].table}@{versions[name].content_tag}"

