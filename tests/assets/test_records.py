"""Reads of Dagster's event log: the newest materialization's metadata of many partitions at once."""

from dagster import AssetMaterialization, DagsterInstance

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
