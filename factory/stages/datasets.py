"""The dataset kinds, one family: raw -> deduplicated -> filtered tables, one Iceberg table per dataset a stage reads.

Each kind writes one table version per dataset and `datasets.json`, naming the versions by content tag (so the
same bytes give the same artifact); the blend (`factory.stages.blend`) and `sft.data.dataset` read the filtered ones. The module is read
with the registry, so it stays light: its run functions import the data code (pyiceberg, pyarrow) when they run.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from factory.config.kinds import StageKind, computed_datasets
from factory.config.data_sections import DatasetConfig, DedupConfig, FiltersConfig, SourceConfig
from factory.config.schema import Experiment
from factory.config.section import GrownSection, Section
from factory.config.sources import source_files
from factory.errors import StageFailed
from factory.registry.layout import SOURCES_FILE
from factory.runtime.context import StageContext
from factory.runtime.progress import wants_progress, work_progress

if TYPE_CHECKING:
    from factory.data.checks import CheckOutcome
    from factory.data.tables import Rows, TableVersion
    from factory.stages.versions import Upstream

DATA_MODULES = ("factory.stages.versions", "factory.data.catalog", "factory.data.tables")
"""What every dataset kind's run function imports."""
ENGINE_MODULES = ("daft",)
"""What the stages on the data engine import when they first build a dataframe: with dedup's datasketch (and its scipy)
and numba (its signatures' loop, compiled or loaded from numba's cache as `factory.data.minhash` is imported), about two
seconds, which a warm interpreter then spends once, not in each stage it forks."""


class RawSettings(Section):
    """The raw stage: each blended dataset's source, and a digest of the files it reads today."""

    sources: dict[str, SourceConfig]
    files: dict[str, str]


class DedupSettings(Section):
    """The dedup stage: each blended dataset's duplicate removal."""

    dedup: dict[str, DedupConfig]
    seed: int


class DatasetFilters(GrownSection):
    """One dataset's filters, the tag its version takes, the duplicate share its check allows and the record columns its
    source keeps (its schema check expects them)."""

    UNSET_LEFT_OUT = ("columns",)

    filters: FiltersConfig
    tag: str | None
    max_duplicate_share: float
    columns: tuple[str, ...] = ()


class FilterSettings(Section):
    """The filter stage: each blended dataset's filters and checks."""

    datasets: dict[str, DatasetFilters]


def _computes_a_dataset(experiment: Experiment) -> bool:
    return bool(computed_datasets(experiment))


def _datasets(experiment: Experiment) -> dict[str, DatasetConfig]:
    return {name: experiment.data.datasets[name] for name in computed_datasets(experiment)}


def _raw(experiment: Experiment) -> RawSettings:
    datasets = _datasets(experiment)
    return RawSettings(sources={name: d.source for name, d in datasets.items()},
                       files={name: source_files(d.source).digest for name, d in datasets.items()})


def _dedup(experiment: Experiment) -> DedupSettings:
    return DedupSettings(dedup={name: d.dedup for name, d in _datasets(experiment).items()}, seed=experiment.seed)


def _filters(experiment: Experiment) -> FilterSettings:
    return FilterSettings(datasets={name: DatasetFilters(filters=d.filters, tag=d.tag, max_duplicate_share=d.max_duplicate_share,
                                                         columns=d.source.columns)
                                    for name, d in _datasets(experiment).items()})


def run_raw_datasets(ctx: StageContext) -> dict[str, Any]:
    """Ingest every dataset's source files into `raw.<name>`, the files the fingerprint names and no others."""
    from factory.data.catalog import open_catalog
    from factory.data.ingest import read_documents
    from factory.data.tables import write_version
    from factory.stages.versions import publish_versions

    catalog = open_catalog(ctx.request.catalog)
    versions, stats, listings = {}, {}, {}
    settings = ctx.settings
    for name, config in settings.sources.items():
        listing = source_files(config)
        if listing.digest != settings.files[name]:
            raise StageFailed(f"the files of dataset {name!r} under {listing.root} changed after this stage was planned; run it again")
        listings[name] = dict(listing.files)
        # the documents spill beside the staging directory, on the registry's disk, never into the artifact
        with work_progress(f"{name}: ingest", "files", ctx.log, wants_progress(1)) as on_part, \
                read_documents(name, config, ctx.log, on_part, scratch=ctx.out.parent) as result:
            versions[name] = write_version(catalog, f"raw.{name}", result.documents, ctx.log)
        stats[name] = {"files_read": result.files_read, **{f"skipped_{reason}": count for reason, count in sorted(result.skipped.items())}}
    (ctx.out / SOURCES_FILE).write_text(json.dumps(listings, indent=1, sort_keys=True))
    return publish_versions(ctx, versions, stats)


def run_deduped_datasets(ctx: StageContext) -> dict[str, Any]:
    """Exact and near-duplicate removal: `raw.<name>` -> `dedup.<name>`, a record batch in memory at a time."""
    from factory.data.catalog import open_catalog
    from factory.data.dedup import find_duplicates, log_dedup
    from factory.data.engine import use_engine
    from factory.data.tables import write_version
    from factory.stages.versions import transform

    settings = ctx.settings
    catalog = open_catalog(ctx.request.catalog)
    use_engine(ctx.log)

    def step(name: str, upstream: Upstream) -> tuple[Rows, dict[str, Any]]:
        with work_progress(f"{name}: near dedup", "documents signed", ctx.log, wants_progress(1)) as on_part:
            found = find_duplicates(upstream.read, settings.dedup[name], settings.seed, on_part, scratch=ctx.out.parent)
        rows = upstream.without(found.removed, found.keys)
        rows_in, rows_out = found.keys.num_rows, rows.keys.num_rows
        log_dedup(ctx.log, rows_in, rows_out, len(found.exact), len(found.near))
        return rows, {"rows_in": rows_in, "rows_out": rows_out, "exact_removed": len(found.exact), "near_removed": len(found.near),
                      "removed_share": round((rows_in - rows_out) / rows_in if rows_in else 0.0, 6)}

    return transform(ctx, "raw_datasets", step, lambda name, rows: write_version(catalog, f"dedup.{name}", rows, ctx.log))


def run_filtered_datasets(ctx: StageContext) -> dict[str, Any]:
    """Quality filters: `dedup.<name>` -> `filtered.<name>`, checked, then tagged `v<n>` (or the configured tag) only if it
    passed; a record batch in memory at a time."""
    from factory.data.catalog import open_catalog
    from factory.data.engine import use_engine
    from factory.data.filters import judge
    from factory.data.tables import name_version, reject_version, write_content
    from factory.stages.dataset_checks import check_dataset, combine, record_checks
    from factory.stages.versions import transform

    datasets = ctx.settings.datasets
    catalog = open_catalog(ctx.request.catalog)
    use_engine(ctx.log)
    checks: dict[str, list[CheckOutcome]] = {}

    def step(name: str, upstream: Upstream) -> tuple[Rows, dict[str, Any]]:
        with work_progress(f"{name}: filters", "documents judged", ctx.log, wants_progress(1)) as on_part:
            judged = judge(upstream.read(upstream.columns), datasets[name].filters, ctx.log, on_part, upstream.rows)
        rows = upstream.without(judged.refused, judged.keys)
        removed = {f"removed_{key}": count for key, count in judged.removed.items()}
        return rows, {"rows_in": judged.keys.num_rows, "rows_out": rows.keys.num_rows, **removed}

    def publish(name: str, rows: Rows) -> TableVersion:
        # The checks decide the name: a version they refuse takes no `v<n>` (nor the configured tag), so no pin can reach it.
        version = write_content(catalog, f"filtered.{name}", rows)
        checks[name] = check_dataset(catalog, version.table, version.content_tag, datasets[name].max_duplicate_share, datasets[name].columns)
        if all(outcome.passed for outcome in checks[name]):
            return name_version(catalog, version, ctx.log, datasets[name].tag)
        return reject_version(catalog, version, ctx.log)

    summary = transform(ctx, "deduped_datasets", step, publish)
    record_checks(ctx.out, combine(checks))  # reported by the orchestrator, also when the artifact comes from the cache
    return summary


RAW_DATASETS = StageKind(
    name="raw_datasets", run="factory.stages.datasets:run_raw_datasets", present=_computes_a_dataset, writes_tables=True, reads_sources=True,
    settings=RawSettings, fingerprint=_raw, artifact=frozenset({"iceberg"}), group="data",
    imports=(*DATA_MODULES, "factory.data.ingest"),
    description="Source files ingested into one Iceberg table per dataset (`raw.<name>`), each version tagged.",
)
DEDUPED_DATASETS = StageKind(
    name="deduped_datasets", run="factory.stages.datasets:run_deduped_datasets", reads=("raw_datasets",), writes_tables=True,
    present=_computes_a_dataset, group="data", artifact=frozenset({"iceberg"}), settings=DedupSettings, fingerprint=_dedup,
    imports=(*DATA_MODULES, "factory.data.dedup", "factory.data.engine", *ENGINE_MODULES, "datasketch"),  # datasketch: LSH's bands
    description="Exact (sha256) and near (MinHash LSH) duplicates removed: `dedup.<name>`.",
)
FILTERED_DATASETS = StageKind(
    name="filtered_datasets", run="factory.stages.datasets:run_filtered_datasets", reads=("deduped_datasets",), writes_tables=True,
    dataset_checks=True, runs_filters=True,
    present=_computes_a_dataset, group="data", artifact=frozenset({"iceberg"}), settings=FilterSettings, fingerprint=_filters,
    imports=(*DATA_MODULES, "factory.data.filters", "factory.data.engine", *ENGINE_MODULES, "factory.stages.dataset_checks"),
    description="Quality filters applied: `filtered.<name>`, checked, and tagged `v<n>` or by name only if the checks pass.",
)
