"""Reads of Dagster's event log that assets need: the latest materialization's metadata."""

from __future__ import annotations

from typing import Any

from dagster import AssetKey, AssetRecordsFilter, DagsterInstance


def latest_metadata(instance: DagsterInstance, asset: str, partition: str) -> dict[str, Any] | None:
    """Metadata of the newest materialization of one asset partition, or None."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[partition]), limit=1
    ).records
    if not records or records[0].asset_materialization is None:
        return None
    return {key: value.value for key, value in records[0].asset_materialization.metadata.items()}
