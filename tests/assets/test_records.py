"""Reads of Dagster's event log: the newest materialization's metadata of many partitions at once."""

import json
import shutil

from dagster import AssetKey, AssetMaterialization, DagsterEventType, DagsterInstance

from assets import records
from assets.partitions import CHECKPOINTS
from assets.records import latest_metadata, latest_metadata_by_partition


def test_the_newest_metadata_of_many_partitions_is_what_asking_each_partition_gives(monkeypatch):
    instance = DagsterInstance.ephemeral()
    keys = [f"a__pretrain-{step:06d}" for step in (100, 200, 300, 400)]
    instance.add_dynamic_partitions(CHECKPOINTS, keys)
    for round_ in (1, 2):
        for key in keys[: 3 if round_ == 1 else 2]:  # two materialized twice, one once, one never
            instance.report_runless_asset_event(AssetMaterialization(CHECKPOINTS, partition=key, metadata={"round": round_, "key": key}))
    instance.report_runless_asset_event(AssetMaterialization("evaluations", partition=keys[3], metadata={"round": 9}))  # another asset
    monkeypatch.setattr(records, "CHUNK", 2)  # records asked for two at a time: chunks join up
    every = latest_metadata_by_partition(instance, CHECKPOINTS)
    assert every == {key: latest_metadata(instance, CHECKPOINTS, key) for key in keys[:3]}
    assert [every[key]["round"] for key in keys[:3]] == [2, 2, 1]
    assert latest_metadata_by_partition(instance, CHECKPOINTS, {keys[2], keys[3]}) == {keys[2]: {"round": 1, "key": keys[2]}}
    assert latest_metadata_by_partition(instance, CHECKPOINTS, set()) == {}


def test_rows_read_as_json_give_what_dagster_reads_and_the_others_are_left_to_dagster(tmp_path):
    """On a SQL event log the metadata of many partitions is read from the rows' JSON: the same values Dagster's own
    reading gives, of every kind of value the factory records; a row holding anything else is read by Dagster."""
    from dagster import MetadataValue, TableColumn, TableSchema, job, op

    instance = DagsterInstance.local_temp(str(tmp_path))
    plain = {"step": 100, "loss": 1.25, "nan": float("nan"), "big": 2**62, "path": "/r/work/x.pt", "file": MetadataValue.path("/r/y"),
             "link": MetadataValue.url("http://127.0.0.1:8765/c/x"), "done": True, "none": None, "notes": MetadataValue.md("# step"),
             "training": {"kind": "pretrain", "config": {"lr": 0.001, "betas": [0.9, 0.95], "nested": {"a": None}}}, "text": "naïve ✓"}
    others = {"schema": {"columns": TableSchema(columns=[TableColumn("a", "int")])}, "dunder": {"training": {"__class__": "AssetKey", "path": ["x"]}},
              "a set": {"training": {"__set__": [1]}}, "quoted": {"path": 'a "__init__.py" b'}, "asset": {"upstream": MetadataValue.asset(AssetKey("x"))},
              "quoted in json": {"training": {"module": "__main__"}}, "ints": {"training": {"lr": 1, "x": 0.0, "on": True}},
              "floats": {"training": {"lr": 1.0, "x": -0.0, "on": 1}}}
    keys = ["plain", "in a run", *others]
    instance.add_dynamic_partitions(CHECKPOINTS, keys)
    for key in keys:
        if key != "in a run":
            instance.report_runless_asset_event(AssetMaterialization(CHECKPOINTS, partition=key, metadata=plain if key == "plain" else others[key]))

    @op
    def record(context) -> None:  # as a training stage's run records its checkpoints: a step's event, with its handles
        context.log_event(AssetMaterialization(CHECKPOINTS, partition="in a run", metadata=plain))

    @job
    def recording() -> None:
        record()

    assert recording.execute_in_process(instance=instance).success
    every = latest_metadata_by_partition(instance, CHECKPOINTS)
    dagsters = {key: latest_metadata(instance, CHECKPOINTS, key) for key in keys}
    assert every.keys() == dagsters.keys()
    for key in ("plain", "in a run"):
        assert every[key].keys() == plain.keys() and every[key]["nan"] != every[key]["nan"] and dagsters[key]["nan"] != dagsters[key]["nan"]
        assert {k: v for k, v in every[key].items() if k != "nan"} == {k: v for k, v in dagsters[key].items() if k != "nan"}
    # Equal to the spec before it, read as its row has it: 1.0 is not 1, and -0.0 is not 0.0.
    assert json.dumps(every["floats"], sort_keys=True) == json.dumps(dagsters["floats"], sort_keys=True) == json.dumps(others["floats"], sort_keys=True)
    assert {key: every[key] for key in others} == {key: dagsters[key] for key in others}
    ids = sorted(instance.event_log_storage.get_latest_storage_id_by_partition(AssetKey(CHECKPOINTS), DagsterEventType.ASSET_MATERIALIZATION).values())
    read = dict(records._rows(instance, ids))
    partitions = {found[0]: found for found in read.values() if found is not None}
    assert partitions.keys() == {"plain", "in a run", "quoted", "ints", "floats"}, "the plain rows (text may hold anything) are read from their JSON"
    # Asked for some entries only: those, and a row is read from its JSON unless one of them is Dagster's to read.
    wanted = ("path", "step")
    assert latest_metadata_by_partition(instance, CHECKPOINTS, labels=wanted) == {
        key: {label: value for label, value in found.items() if label in wanted} for key, found in dagsters.items()}
    assert {found[0] for found in dict(records._rows(instance, ids, wanted)).values() if found is not None} == set(keys)


def test_records_read_again_come_from_the_instances_cache_and_a_new_record_a_stale_row_or_a_damaged_file_are_read_from_the_log(tmp_path, caplog):
    """The records of many partitions, read once from the event log, are kept in a cache under the instance's directory
    (`assets.record_cache`); read again, they come from it, its one copy of a spec they share included. A partition
    materialized since is read from the log; a cached row whose partition is not the log's for that storage id is not
    used; a damaged file is removed with a warning and filled again; a storage made anew at the same place gets a file of
    its own."""
    import sqlite3

    from assets.record_cache import SHARED_BYTES, RecordCache

    (tmp_path / "home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "home"))
    keys = [f"a__pretrain-{step:06d}" for step in (100, 200, 300)]
    instance.add_dynamic_partitions(CHECKPOINTS, [*keys, "b__pretrain-000100"])
    spec = {"kind": "pretrain", "config": {"lr": 0.001, "layers": list(range(100)), "name": "naïve ✓", "on": True}}
    assert len(json.dumps(spec)) > SHARED_BYTES
    for step, key in zip((100, 200, 300), keys):
        instance.report_runless_asset_event(AssetMaterialization(CHECKPOINTS, partition=key, metadata={"step": step, "training": spec, "x": -0.0}))
    # Another training's spec, equal in Python (1 == True) but not in JSON: kept apart.
    other = {**spec, "config": {**spec["config"], "on": 1}}
    instance.report_runless_asset_event(AssetMaterialization(CHECKPOINTS, partition="b__pretrain-000100", metadata={"step": 150, "training": other}))
    keys_b = [*keys, "b__pretrain-000100"]
    dagsters = {key: latest_metadata(instance, CHECKPOINTS, key) for key in keys_b}
    cache = RecordCache.of(instance)
    assert cache is not None and not cache.path.exists()

    assert latest_metadata_by_partition(instance, CHECKPOINTS) == dagsters  # read from the log, and kept
    with sqlite3.connect(cache.path) as db:
        assert db.execute("SELECT count(*) FROM records").fetchone() == (4,)
        assert db.execute("SELECT count(*) FROM shared_values").fetchone() == (2,)  # each spec, once
        db.execute("UPDATE records SET metadata = replace(metadata, '\"step\":100', '\"step\":999')")
    again = latest_metadata_by_partition(instance, CHECKPOINTS)
    assert again[keys[0]]["step"] == 999, "read again, a record comes from the cache (its row changed here to show it)"
    assert {key: again[key] for key in keys[1:]} == {key: dagsters[key] for key in keys[1:]}
    assert json.dumps(again[keys[1]]) == json.dumps(dagsters[keys[1]])  # -0.0 stays -0.0, the labels in their order
    assert json.dumps(again["b__pretrain-000100"]) == json.dumps(dagsters["b__pretrain-000100"])  # 1 stays 1
    assert latest_metadata_by_partition(instance, CHECKPOINTS, labels=("step",)) == {
        keys[0]: {"step": 999}, keys[1]: {"step": 200}, keys[2]: {"step": 300}, "b__pretrain-000100": {"step": 150}}

    instance.report_runless_asset_event(AssetMaterialization(CHECKPOINTS, partition=keys[0], metadata={"step": 101, "training": spec}))
    assert latest_metadata_by_partition(instance, CHECKPOINTS)[keys[0]] == {"step": 101, "training": spec}  # a newer record: from the log
    with sqlite3.connect(cache.path) as db:
        db.execute("UPDATE records SET partition = 'another' WHERE metadata LIKE '%\"step\":200%'")
        db.execute("UPDATE records SET metadata = replace(metadata, '\"step\":200', '\"step\":888')")
    assert latest_metadata_by_partition(instance, CHECKPOINTS)[keys[1]] == dagsters[keys[1]], "a row of another partition is not used"

    cache.path.write_bytes(b"not a database" * 100)
    with caplog.at_level("WARNING", logger="assets.record_cache"):
        assert latest_metadata_by_partition(instance, CHECKPOINTS)[keys[2]] == dagsters[keys[2]]
    assert f"the cache of event-log records {cache.path} cannot be read" in caplog.text
    with sqlite3.connect(cache.path) as db:  # filled again
        assert db.execute("SELECT count(*) FROM records").fetchone() == (4,)

    instance.dispose()
    for made in (tmp_path / "home").iterdir():  # the instance's storage made anew where it was
        if made.name != "factory":
            shutil.rmtree(made) if made.is_dir() else made.unlink()
    anew = DagsterInstance.local_temp(str(tmp_path / "home"))
    assert RecordCache.of(anew).path != cache.path and RecordCache.of(anew).path.parent == cache.path.parent
    assert RecordCache.of(DagsterInstance.ephemeral()) is None


def test_a_read_of_some_labels_keeps_those_only_and_a_read_of_others_or_of_all_reads_the_log_again(tmp_path, caplog):
    """A read of a few labels (the backfill's) parses and keeps those only; read again, they come from the cache. A read
    of a label the cache has not kept, or of every label, goes to the event log and keeps what it read; a whole record is
    never replaced by some of its labels. A cache an earlier factory kept in another shape is made anew, without a warning."""
    import sqlite3

    from assets.record_cache import RecordCache

    instance = DagsterInstance.local_temp(str(tmp_path))
    keys = ["a__pretrain-000100", "a__pretrain-000200"]
    instance.add_dynamic_partitions(CHECKPOINTS, keys)
    spec = {"kind": "pretrain", "config": {"layers": list(range(100))}}
    for step, key in zip((100, 200), keys):
        instance.report_runless_asset_event(AssetMaterialization(CHECKPOINTS, partition=key, metadata={
            "path": f"/r/{step}.pt", "stored": "local", "step": step, "training": spec}))
    dagsters = {key: latest_metadata(instance, CHECKPOINTS, key) for key in keys}
    cache = RecordCache.of(instance)

    def rows() -> list[tuple]:
        with sqlite3.connect(cache.path) as db:
            return db.execute("SELECT metadata, labels FROM records ORDER BY id").fetchall()

    wanted = ("path", "stored")
    assert latest_metadata_by_partition(instance, CHECKPOINTS, labels=wanted) == {
        key: {"path": dagsters[key]["path"], "stored": "local"} for key in keys}
    assert rows() == [('{"path":"/r/100.pt","stored":"local"}', '["path", "stored"]'), ('{"path":"/r/200.pt","stored":"local"}', '["path", "stored"]')]
    with sqlite3.connect(cache.path) as db:
        assert db.execute("SELECT count(*) FROM shared_values").fetchone() == (0,), "the spec was neither read nor kept"
        db.execute("UPDATE records SET metadata = replace(metadata, '/r/100.pt', '/kept/100.pt')")
    assert latest_metadata_by_partition(instance, CHECKPOINTS, keys[:1], labels=("path",)) == {keys[0]: {"path": "/kept/100.pt"}}, \
        "read again, labels the cache kept come from it (its row changed here to show it)"
    assert latest_metadata_by_partition(instance, CHECKPOINTS, keys[:1], labels=("path", "step")) == {keys[0]: {"path": "/r/100.pt", "step": 100}}
    assert latest_metadata_by_partition(instance, CHECKPOINTS) == dagsters  # every label: from the log, and kept whole
    assert [labels for _, labels in rows()] == [None, None]
    latest = instance.event_log_storage.get_latest_storage_id_by_partition(AssetKey(CHECKPOINTS), DagsterEventType.ASSET_MATERIALIZATION)
    record = cache.get(latest)
    assert record[latest[keys[0]]] == (keys[0], dagsters[keys[0]])
    cache.put({latest[keys[0]]: (keys[0], {"path": "/other.pt"})}, ("path",))
    assert cache.get(latest) == record, "a whole record stays whole"

    cache.remove()
    with sqlite3.connect(cache.path) as db:  # as the factory before kept it: whole records, schema 1
        db.executescript("CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL); INSERT INTO meta VALUES ('schema', 1);"
                         "CREATE TABLE records (id INTEGER PRIMARY KEY, partition TEXT NOT NULL, metadata TEXT NOT NULL, shared TEXT NOT NULL);")
    with caplog.at_level("WARNING", logger="assets.record_cache"):
        assert latest_metadata_by_partition(instance, CHECKPOINTS, labels=wanted)[keys[1]] == {"path": "/r/200.pt", "stored": "local"}
    assert caplog.text == ""
    assert len(rows()) == 2
