"""The shared held-out corpus that `heldout_bpb` scores every experiment on, as an Iceberg table version.

The generator and the catalog are imported when the corpus is written or looked for: loading the code location stays light.
"""

import json
from collections import Counter
from collections.abc import Iterable

from dagster import AssetExecutionContext, AssetMaterialization, DataVersion, MaterializeResult, MetadataValue, asset

from factory.evals.benchmarks import benchmark
from factory.evals.heldout import REF, TABLE
from factory.podium.links import table_url
from resources import FactoryStores


def _write_corpus(context: AssetExecutionContext, stores: FactoryStores) -> tuple[dict, str]:
    """Write the corpus (the same bytes every time); its materialization metadata and content tag."""
    from factory.data.catalog import open_catalog
    from factory.data.tables import read_version
    from factory.evals.heldout import PROGRAMS, SEED, write_heldout_corpus

    catalog = open_catalog(stores.catalog())
    version = write_heldout_corpus(catalog, context.log)
    metadata = read_version(catalog, TABLE, version.snapshot_id, columns=("id", "metadata"))["metadata"].to_pylist()
    return {
        "table": version.ref, "content": version.content_tag, "snapshot_id": version.snapshot_id, "documents": version.rows,
        "bytes": version.bytes, "podium": MetadataValue.url(table_url(TABLE, version.snapshot_id)),
        "generator": MetadataValue.json({"programs": PROGRAMS, "seed": SEED, "split": "test"}),
        "families": MetadataValue.json(dict(Counter(json.loads(m)["family"] for m in metadata))),
    }, version.content_tag


@asset(
    description=f"Held-out Python functions ({REF}) that heldout_bpb scores every experiment on: generated from a fixed seed, "
                "the same for all, so their scores compare.",
    kinds={"iceberg"},
    group_name="evals",
)
def heldout_corpus(context: AssetExecutionContext, stores: FactoryStores) -> MaterializeResult:
    metadata, content = _write_corpus(context, stores)
    return MaterializeResult(metadata=metadata, data_version=DataVersion(content))


def ensure_heldout_corpus(context: AssetExecutionContext, stores: FactoryStores, benchmarks: Iterable[str]) -> None:
    """Write the corpus when an evaluation reads it and it was never written, and report it as a materialization of
    `heldout_corpus`: a run from git, `factory run` or a backfill needs no step a person must remember."""
    from factory.data.catalog import open_catalog
    from factory.data.tables import missing_refs

    if not any(benchmark(name).data == REF for name in set(benchmarks)) or not missing_refs(open_catalog(stores.catalog()), [REF]):
        return
    context.log.info(f"{REF} does not exist yet: generating the held-out corpus first")
    metadata, _ = _write_corpus(context, stores)
    context.log_event(AssetMaterialization(asset_key="heldout_corpus", metadata=metadata))
