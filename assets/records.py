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

from assets.record_cache import RecordCache
from factory.collector import collector_paused

CHUNK = 500
"""Records asked for at once by storage id (a query's parameters stay under SQLite's and PostgreSQL's limits)."""
VALUE_FIELDS = {"IntMetadataEntryData": ("value", int), "FloatMetadataEntryData": ("value", (float, int)),
                "BoolMetadataEntryData": ("value", bool), "TextMetadataEntryData": ("text", str), "PathMetadataEntryData": ("path", str),
                "UrlMetadataEntryData": ("url", str), "MarkdownMetadataEntryData": ("md_str", str),
                "JsonMetadataEntryData": ("data", (dict, list)), "NullMetadataEntryData": (None, type(None))}
"""The metadata values read from a row, by the class Dagster stores them as: the field that holds the value (None: none,
the value is null) and the types it holds; a value of another type is Dagster's to read."""


def latest_metadata(instance: DagsterInstance, asset: str, partition: str) -> dict[str, Any] | None:
    """Metadata of the newest materialization of one asset partition, or None."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[partition]), limit=1
    ).records
    if not records or records[0].asset_materialization is None:
        return None
    return {key: value.value for key, value in records[0].asset_materialization.metadata.items()}


def latest_metadata_by_partition(instance: DagsterInstance, asset: str, partitions: Collection[str] | None = None,
                                 labels: Collection[str] | None = None) -> dict[str, dict[str, Any]]:
    """Partition -> metadata of its newest materialization (the entries of `labels` only, when given), for every partition
    of one asset (or of `partitions`) that has one: one query for the newest record of each partition, then the records
    by id, a chunk at a time (never a query per partition, which is minutes at 10,000 checkpoints); records read before
    come from the instance's cache of them (`assets.record_cache`). A read of a few labels (the backfill's `path` and
    `stored`) parses and keeps those only: keeping whole records would take parsing and checking every label of each
    (a training's spec), more than the read itself. Not to be changed by the caller: records that hold an equal large
    value (one training's spec) may share one object."""
    key = AssetKey(asset)
    if isinstance(labels, str):
        raise TypeError(f"labels is a collection of metadata labels, not one label: ({labels!r},)")
    if partitions is not None and not partitions:
        return {}  # (the event log reads an empty set as "every partition")
    latest = instance.event_log_storage.get_latest_storage_id_by_partition(
        key, DagsterEventType.ASSET_MATERIALIZATION, set(partitions) if partitions is not None else None)
    found: dict[str, dict[str, Any]] = {}
    left = []
    cache = RecordCache.of(instance)
    with collector_paused():
        kept = cache.get(latest, labels) if cache is not None else {}
        for partition, metadata in kept.values():
            found[partition] = _only(metadata, labels)
        read_now = {}
        for storage_id, read in _rows(instance, sorted(set(latest.values()) - kept.keys()), labels):
            if read is not None:
                read_now[storage_id] = read
                found[read[0]] = _only(read[1], labels)
            else:
                left.append(storage_id)
        if cache is not None:
            cache.put(read_now, labels)
        for start in range(0, len(left), CHUNK):
            _read_records(instance, key, left[start : start + CHUNK], labels, found)
    return found


def _only(metadata: dict[str, Any], labels: Collection[str] | None) -> dict[str, Any]:
    """The entries of `labels` of `metadata` (all of them, when None)."""
    return metadata if labels is None else {name: value for name, value in metadata.items() if name in labels}


def _read_records(instance: DagsterInstance, key: AssetKey, chunk: list[int], labels: Collection[str] | None,
                  found: dict[str, dict[str, Any]]) -> None:
    """The partition and metadata of each record of `chunk` (storage ids), as Dagster reads them, into `found`."""
    for record in instance.fetch_materializations(AssetRecordsFilter(asset_key=key, storage_ids=chunk), limit=len(chunk)).records:
        materialization = record.asset_materialization
        if materialization is not None and materialization.partition is not None:
            found[materialization.partition] = {name: value.value for name, value in materialization.metadata.items()
                                                if labels is None or name in labels}


def _rows(instance: DagsterInstance, ids: list[int], labels: Collection[str] | None = None) -> Iterator[tuple[int, tuple[str, dict[str, Any]] | None]]:
    """(storage id, what its row says: partition and metadata, of `labels` only when given; None where Dagster must read
    it) of each id, all None where the event log is not SQL (or this Dagster keeps it otherwise)."""
    try:
        import sqlalchemy
        from dagster._core.storage.event_log.schema import SqlEventLogStorageTable as table
        from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage
    except ImportError:
        SqlEventLogStorage = None  # noqa: N806
    storage = instance.event_log_storage
    if SqlEventLogStorage is None or not isinstance(storage, SqlEventLogStorage):
        yield from ((storage_id, None) for storage_id in ids)
        return
    # One connection for every chunk (PostgreSQL's take milliseconds each), let go of before the rows are parsed (SQLite's
    # holds a lock while it is open).
    with storage.index_connection() as connection:
        rows = [row for start in range(0, len(ids), CHUNK)
                for row in connection.execute(sqlalchemy.select(table.c.id, table.c.event).where(table.c.id.in_(ids[start : start + CHUNK])))]
    checked: dict[str, Any] = {}
    read = {storage_id: _materialization(text, labels, checked) for storage_id, text in rows}
    yield from ((storage_id, read.get(storage_id)) for storage_id in ids)


def _materialization(text: str, labels: Collection[str] | None = None, checked: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]] | None:
    """A row's partition and metadata (the entries of `labels` only, when given), where the row is a materialization as
    Dagster writes one (logged in a run or without one) whose metadata entries read are all of the kinds and types in
    VALUE_FIELDS, and whose JSON values hold no key or text that starts with two underscores (an object Dagster would read
    as one of its own); None otherwise.

    `checked`: the last JSON value of each label that passed that check, from rows read before. The checkpoints of one
    training follow one another in the log and record its spec alike: a value equal to that one has the same keys and
    texts, so it is not checked again (each row keeps its own value: equal numbers may still differ in type or sign)."""
    try:
        entry = json.loads(text)
        event = entry["dagster_event"]
        data = event["event_specific_data"]
        materialization = data["materialization"]
        if (entry["__class__"], event["__class__"], event["event_type_value"], data["__class__"], materialization["__class__"]) != (
                "EventLogEntry", "DagsterEvent", "ASSET_MATERIALIZATION", "StepMaterializationData", "AssetMaterialization"):
            return None
        metadata = {}
        for item in materialization["metadata_entries"]:
            if labels is not None and item["label"] not in labels:
                continue  # not asked for: not checked either (the JSON check of a training spec is most of a row's time)
            value = item["entry_data"]
            if item["__class__"] != "EventMetadataEntry" or value["__class__"] not in VALUE_FIELDS:
                return None
            field, types = VALUE_FIELDS[value["__class__"]]
            found = None if field is None else value[field]
            if not isinstance(found, types) or (isinstance(found, bool) and types is not bool):
                return None
            if types == (dict, list):
                found = _checked_json(item["label"], found, {} if checked is None else checked)
                if found is None:
                    return None
            metadata[item["label"]] = found
        return materialization["partition"], metadata
    except (ValueError, TypeError, KeyError):
        return None


def _checked_json(label: str, value: dict | list, checked: dict[str, Any]) -> dict | list | None:
    """`value`, or None when it holds a key or text that starts with two underscores (not looked for again when it equals
    the last value of `label` that passed)."""
    last = checked.get(label)
    if last is not None and last == value:
        return value
    if '"__' in json.dumps(value):
        return None
    checked[label] = value
    return value
