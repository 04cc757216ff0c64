"""Reads of Dagster's event log that assets need: the latest materialization's metadata."""

from __future__ import annotations

from typing import Any

from collections.abc import Collection

from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance

CHUNK = 500
"""Records asked for at once by storage id (a query's parameters stay under SQLite's and PostgreSQL's limits)."""


def latest_metadata(instance: DagsterInstance, asset: str, partition: str) -> dict[str, Any] | None:
    """Metadata of the newest materialization of one asset partition, or None."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[partition]), limit=1
    ).records
    if not records or records[0].asset_materialization is None:
        return None
    return {key: value.value for key, value in records[0].asset_materialization.metadata.items()}


def latest_metadata_by_partition(instance: DagsterInstance, asset: str, partitions: Collection[str] | None = None) -> dict[str, dict[str, Any]]:
    """Partition -> metadata of its newest materialization, for every partition of one asset (or of `partitions`) that has
    one: one query for the newest record of each partition, then the records by id, a chunk at a time (never a query
    per partition, which is minutes at 10,000 checkpoints)."""
    key = AssetKey(asset)
    if partitions is not None and not partitions:
        return {}  # (the event log reads an empty set as "every partition")
    latest = instance.event_log_storage.get_latest_storage_id_by_partition(
        key, DagsterEventType.ASSET_MATERIALIZATION, set(partitions) if partitions is not None else None)
    ids = sorted(latest.values())
    found: dict[str, dict[str, Any]] = {}
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        for record in instance.fetch_materializations(AssetRecordsFilter(asset_key=key, storage_ids=chunk), limit=len(chunk)).records:
            materialization = record.asset_materialization
            if materialization is not None and materialization.partition is not None:
                found[materialization.partition] = {name: value.value for name, value in materialization.metadata.items()}
    return found
