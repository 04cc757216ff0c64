"""Reads of Dagster's event log that assets need: the latest materialization's metadata.

Many partitions' metadata (`latest_metadata_by_partition`, which `factory evals backfill` asks of every checkpoint) is
read from the event log's rows as JSON: Dagster's own reading of a record builds an object for every value in it (its
event, its materialization, each metadata entry), about 0.3 ms a record, which is 3 s at 10,000 checkpoints. A row
whose shape is not exactly that of a materialization with the metadata values read here (numbers, text, paths, URLs,
Markdown, booleans, nulls, JSON) is read by Dagster, as is every row of a storage that is not SQL.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from typing import Any

from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance

CHUNK = 500
"""Records asked for at once by storage id (a query's parameters stay under SQLite's and PostgreSQL's limits)."""
VALUE_FIELDS = {"IntMetadataEntryData": "value", "FloatMetadataEntryData": "value", "BoolMetadataEntryData": "value",
                "TextMetadataEntryData": "text", "PathMetadataEntryData": "path", "UrlMetadataEntryData": "url",
                "MarkdownMetadataEntryData": "md_str", "JsonMetadataEntryData": "data", "NullMetadataEntryData": None}
"""The metadata values read from a row, by the class Dagster stores them as: the field that holds the value (None: none,
the value is null)."""


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
        left = []
        for storage_id, read in _rows(instance, chunk):
            if read is not None:
                found[read[0]] = read[1]
            else:
                left.append(storage_id)
        for record in instance.fetch_materializations(AssetRecordsFilter(asset_key=key, storage_ids=left), limit=len(left)).records if left else ():
            materialization = record.asset_materialization
            if materialization is not None and materialization.partition is not None:
                found[materialization.partition] = {name: value.value for name, value in materialization.metadata.items()}
    return found


def _rows(instance: DagsterInstance, ids: list[int]) -> Iterator[tuple[int, tuple[str, dict[str, Any]] | None]]:
    """(storage id, what its row says: partition and metadata; None where Dagster must read it) of each id,
    all None where the event log is not SQL."""
    import sqlalchemy
    from dagster._core.storage.event_log.schema import SqlEventLogStorageTable
    from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

    storage = instance.event_log_storage
    if not isinstance(storage, SqlEventLogStorage):
        yield from ((storage_id, None) for storage_id in ids)
        return
    table = SqlEventLogStorageTable
    with storage.index_connection() as connection:
        rows = connection.execute(sqlalchemy.select(table.c.id, table.c.event).where(table.c.id.in_(ids))).fetchall()
    read = {storage_id: _materialization(text) for storage_id, text in rows}
    yield from ((storage_id, read.get(storage_id)) for storage_id in ids)


def _materialization(text: str) -> tuple[str, dict[str, Any]] | None:
    """A row's partition and metadata, where the row is a materialization of exactly the shape Dagster
    writes (its metadata of the values in VALUE_FIELDS, and no other object: every `"__class__"` of the row is one of
    the event's five or of its entries, and no other key of Dagster's, `"__set__"` say, is there); None otherwise."""
    try:
        entry = json.loads(text)
        event = entry["dagster_event"]
        data = event["event_specific_data"]
        materialization = data["materialization"]
        if (entry["__class__"], event["__class__"], event["event_type_value"], data["__class__"], materialization["__class__"]) != (
                "EventLogEntry", "DagsterEvent", "ASSET_MATERIALIZATION", "StepMaterializationData", "AssetMaterialization"):
            return None
        entries = materialization["metadata_entries"]
        classes = text.count('"__class__"')
        if classes != 5 + 2 * len(entries) or text.count('"__') != classes:
            return None  # an object nested elsewhere (in a JSON value, say), or a set, an enum...: Dagster reads it
        metadata = {}
        for item in entries:
            value = item["entry_data"]
            if item["__class__"] != "EventMetadataEntry" or (kind := value["__class__"]) not in VALUE_FIELDS:
                return None
            metadata[item["label"]] = None if VALUE_FIELDS[kind] is None else value[VALUE_FIELDS[kind]]
        return materialization["partition"], metadata
    except (ValueError, TypeError, KeyError):
        return None
