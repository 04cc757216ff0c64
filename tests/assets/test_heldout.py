"""The held-out corpus asset: written with tag v1, the same bytes again, and generated first when an evaluation needs it."""

from dagster import AssetKey, AssetExecutionContext, DagsterInstance, asset, materialize

from assets.heldout import ensure_heldout_corpus, heldout_corpus
from factory.data.catalog import open_catalog
from factory.data.tables import content_of, missing_refs
from factory.evals.heldout import REF
from resources import FactoryStores


def test_the_corpus_is_written_as_v1_and_materializing_it_again_gives_the_same_data_version(tmp_path):
    stores = FactoryStores(root=str(tmp_path))
    instance = DagsterInstance.ephemeral()
    versions = []
    for _ in range(2):
        result = materialize([heldout_corpus], instance=instance, resources={"stores": stores})
        [event] = result.get_asset_materialization_events()
        versions.append(event.materialization.tags["dagster/data_version"])
    assert versions[0] == versions[1] == content_of(open_catalog(stores.catalog()), REF)


def test_an_evaluation_of_heldout_bpb_generates_the_missing_corpus_and_says_so(tmp_path):
    stores = FactoryStores(root=str(tmp_path))
    catalog = open_catalog(stores.catalog())

    @asset
    def evaluation(context: AssetExecutionContext, stores: FactoryStores) -> None:
        ensure_heldout_corpus(context, stores, ["val_bpb", "next_line"])  # own-split benchmarks read no corpus
        assert missing_refs(catalog, [REF])
        ensure_heldout_corpus(context, stores, ["val_bpb", "heldout_bpb"])

    instance = DagsterInstance.ephemeral()
    assert materialize([evaluation], instance=instance, resources={"stores": stores}).success
    assert missing_refs(catalog, [REF]) == []
    assert instance.get_latest_materialization_event(AssetKey("heldout_corpus")) is not None
