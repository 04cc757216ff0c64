"""Runners of the data stages: raw -> deduplicated -> filtered tables per dataset, then the blend.

Each stage writes one Iceberg version per dataset and an artifact (`datasets.json` or
`blend.json`) that names the versions by content tag, so the same bytes give the same artifact.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import pyarrow as pa

from factory.config.schema import DataConfig, DatasetConfig
from factory.config.sources import SOURCES_FILE, source_files
from factory.data.blend import build_blend
from factory.data.catalog import open_catalog
from factory.data.checks import CheckOutcome
from factory.data.dedup import deduplicate
from factory.data.filters import apply_filters
from factory.data.ingest import read_documents
from factory.data.tables import TableVersion, name_version, read_version, reject_version, resolve, write_content, write_version
from factory.errors import StageFailed
from factory.runtime.context import BLEND_FILE, DATASETS_FILE, StageContext
from factory.stages.dataset_checks import check_dataset, combine, record_checks


def load_versions(ctx: StageContext, stage: str) -> dict[str, TableVersion]:
    """The table versions an upstream data stage published, by dataset name (snapshot ids resolved again)."""
    records = json.loads((ctx.upstream(stage) / DATASETS_FILE).read_text())
    catalog = open_catalog(ctx.request.catalog)
    versions = {}
    for name, record in records.items():
        fields = {key: record[key] for key in ("table", "tag", "content_tag", "rows", "bytes")}
        versions[name] = TableVersion(**fields, snapshot_id=resolve(catalog, record["table"], record["content_tag"]))
    return versions


def _publish_versions(ctx: StageContext, versions: dict[str, TableVersion], stats: dict[str, dict[str, Any]]) -> dict[str, Any]:
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


def _transform(
    ctx: StageContext, upstream: str, step: Callable[[str, pa.Table], tuple[pa.Table, dict[str, Any]]],
    publish: Callable[[str, pa.Table], TableVersion],
) -> dict[str, Any]:
    """Read each dataset's upstream version, apply `step`, and `publish` the result as a version."""
    catalog = open_catalog(ctx.request.catalog)
    versions, stats = {}, {}
    for name, source in load_versions(ctx, upstream).items():
        documents, stats[name] = step(name, read_version(catalog, source.table, source.snapshot_id))
        versions[name] = publish(name, documents)
    return _publish_versions(ctx, versions, stats)


def run_raw_datasets(ctx: StageContext) -> dict[str, Any]:
    """Ingest every dataset's source files into `raw.<name>`, the files the fingerprint names and no others."""
    catalog = open_catalog(ctx.request.catalog)
    versions, stats, listings = {}, {}, {}
    settings = ctx.settings
    for name, config in settings.sources.items():
        listing = source_files(config)
        if listing.digest != settings.files[name]:
            raise StageFailed(f"the files of dataset {name!r} under {listing.root} changed after this stage was planned; run it again")
        listings[name] = dict(listing.files)
        result = read_documents(name, config, ctx.log)
        versions[name] = write_version(catalog, f"raw.{name}", result.documents, ctx.log)
        stats[name] = {"files_read": result.files_read, **{f"skipped_{reason}": count for reason, count in sorted(result.skipped.items())}}
    (ctx.out / SOURCES_FILE).write_text(json.dumps(listings, indent=1, sort_keys=True))
    return _publish_versions(ctx, versions, stats)


def run_deduped_datasets(ctx: StageContext) -> dict[str, Any]:
    """Exact and near-duplicate removal: `raw.<name>` -> `dedup.<name>`."""
    settings = ctx.settings
    catalog = open_catalog(ctx.request.catalog)

    def step(name: str, documents: pa.Table) -> tuple[pa.Table, dict[str, Any]]:
        result = deduplicate(documents, settings.dedup[name], settings.seed, ctx.log)
        return result.documents, {
            "rows_in": result.rows_in, "rows_out": result.rows_out, "exact_removed": result.exact_removed,
            "near_removed": result.near_removed, "removed_share": round(result.removed_share, 6),
        }

    return _transform(ctx, "raw_datasets", step, lambda name, documents: write_version(catalog, f"dedup.{name}", documents, ctx.log))


def run_filtered_datasets(ctx: StageContext) -> dict[str, Any]:
    """Quality filters: `dedup.<name>` -> `filtered.<name>`, checked, then tagged `v<n>` (or the configured tag) only if it passed."""
    datasets = ctx.settings.datasets
    catalog = open_catalog(ctx.request.catalog)
    checks: dict[str, list[CheckOutcome]] = {}

    def step(name: str, documents: pa.Table) -> tuple[pa.Table, dict[str, Any]]:
        result = apply_filters(documents, datasets[name].filters, ctx.log)
        removed = {f"removed_{key}": count for key, count in result.removed.items()}
        return result.documents, {"rows_in": result.rows_in, "rows_out": result.rows_out, **removed}

    def publish(name: str, documents: pa.Table) -> TableVersion:
        # The checks decide the name: a version they refuse takes no `v<n>` (nor the configured tag), so no pin can reach it.
        version = write_content(catalog, f"filtered.{name}", documents)
        checks[name] = check_dataset(catalog, version.table, version.content_tag, datasets[name].max_duplicate_share)
        if all(outcome.passed for outcome in checks[name]):
            return name_version(catalog, version, ctx.log, datasets[name].tag)
        return reject_version(catalog, version, ctx.log)

    summary = _transform(ctx, "deduped_datasets", step, publish)
    record_checks(ctx.out, combine(checks))  # reported by the orchestrator, also when the artifact comes from the cache
    return summary


def run_blend(ctx: StageContext) -> dict[str, Any]:
    """The mixture: this experiment's filtered datasets and pinned table versions, with weights and modes."""
    data = _blend_config(ctx)
    versions = load_versions(ctx, "filtered_datasets") if "filtered_datasets" in ctx.request.spec.upstream else {}
    blend = build_blend(open_catalog(ctx.request.catalog), data, versions)
    (ctx.out / BLEND_FILE).write_text(json.dumps(blend.to_json(), indent=2, sort_keys=True))
    ctx.log.info("blend of %s", ", ".join(f"{p.label} ({p.table}@{p.version}) x{w:.3f}" for p, w in zip(blend.parts, blend.weights, strict=True)))
    summary: dict[str, Any] = {"parts": len(blend.parts), "validation_percent": blend.validation_percent}
    for part, weight in zip(blend.parts, blend.weights, strict=True):
        summary[f"{part.label}/version"] = f"{part.table}@{part.version}"
        summary[f"{part.label}/share"] = round(weight, 6)
        summary[f"{part.label}/mode"] = part.mode
        summary[f"{part.label}/rows"] = part.rows
    return summary


def _blend_config(ctx: StageContext) -> DataConfig:
    """The data section as far as the blend needs it: dataset parts are checked against the upstream versions instead."""
    settings = ctx.settings
    names = {part.dataset for part in settings.blend if part.dataset}
    return DataConfig(blend=settings.blend, validation_percent=settings.validation_percent,
                      datasets={name: DatasetConfig() for name in sorted(names)})
