"""The code location: the asset graph's lineage and partitioning as the Dagster UI shows it."""

from dagster import AssetKey, DynamicPartitionsDefinition

from assets.definitions import defs
from assets.partitions import EXPERIMENTS

LINEAGE = {
    "corpus": set(),
    "tokenizer": {"corpus"},
    "checkpoints": {"corpus", "tokenizer"},
    "model": {"checkpoints", "tokenizer"},
    "evaluation": {"model", "corpus"},
    "leaderboard": {"evaluation"},
}


def test_asset_graph_has_the_lineage_from_corpus_to_leaderboard():
    graph = defs.resolve_asset_graph()
    parents = {key.to_user_string(): {p.to_user_string() for p in graph.get(key).parent_keys} for key in graph.get_all_asset_keys()}
    assert parents == LINEAGE


def test_stage_assets_are_partitioned_by_experiment():
    graph = defs.resolve_asset_graph()
    for name in LINEAGE:
        partitions = graph.get(AssetKey(name)).partitions_def
        if name == "leaderboard":
            assert partitions is None
        else:
            assert isinstance(partitions, DynamicPartitionsDefinition) and partitions.name == EXPERIMENTS
