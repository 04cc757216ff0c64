"""One asset per stage, partitioned by experiment: hit the registry, or launch the stage process."""


from collections.abc import Iterator

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    DataVersion,
    Failure,
    MaterializeResult,
    MetadataValue,
    PipesExecutionResult,
    asset,
)

from assets.partitions import COMMIT_TAG, experiments_partitions
from assets.records import latest_metadata
from factory.config import UPSTREAM, config_hash, plan_stage
from factory.registry import Provenance, git_commit
from factory.stages.request import StageRequest
from resources import ExperimentFiles, FactoryStores, StageLauncher

DESCRIPTIONS = {
    "corpus": "Python standard library sources in an Iceberg table, split train/validation by hash of path.",
    "tokenizer": "Byte-level BPE trained on the corpus train split.",
    "checkpoints": "Pretraining run: a GPT trained on packed token sequences; periodic and final checkpoints.",
    "model": "The final weights exported with their config and tokenizer.",
    "evaluation": "Validation bits-per-byte of the model and of its untrained initialisation.",
}
KINDS = {"corpus": {"iceberg"}, "tokenizer": {"tokenizers"}, "checkpoints": {"torch"}, "model": {"torch"}, "evaluation": {"torch"}}


def build_stage_asset(kind: str) -> AssetsDefinition:
    """The asset of one stage kind."""

    @asset(
        name=kind,
        partitions_def=experiments_partitions,
        deps=list(UPSTREAM[kind]),
        description=DESCRIPTIONS[kind],
        kinds=KINDS[kind],
        group_name="pipeline",
    )
    def stage(
        context: AssetExecutionContext, experiments: ExperimentFiles, stores: FactoryStores, launcher: StageLauncher
    ) -> Iterator[MaterializeResult | PipesExecutionResult]:
        experiment = experiments.load(context.partition_key, commit=context.run.tags.get(COMMIT_TAG))
        if kind not in experiment.stages():
            raise Failure(description=f"{experiment.name} has no {kind} stage: its file has no section for it")
        upstream = {name: upstream_digest(context, name) for name in UPSTREAM[kind]}
        spec = plan_stage(experiment, kind, upstream)
        registry = stores.registry()
        manifest = registry.lookup(spec.fingerprint)
        if manifest is not None:
            context.log.info(f"{kind}: registry hit {manifest.digest[:12]} (fingerprint {spec.fingerprint[:12]}); not recomputed")
            metadata = {**manifest.metadata(), "cache": "hit", "artifact": MetadataValue.path(str(registry.path(manifest.digest)))}
            yield MaterializeResult(metadata=metadata, data_version=DataVersion(manifest.digest))
            return
        provenance = Provenance(experiment=experiment.name, config_hash=config_hash(experiment), git_commit=git_commit())
        request = StageRequest(spec=spec, registry=str(registry.root), catalog=stores.catalog(), provenance=provenance)
        yield from launcher.launch(context, request)

    return stage


def upstream_digest(context: AssetExecutionContext, name: str) -> str:
    """Artifact digest of the upstream stage's latest materialization for this experiment."""
    metadata = latest_metadata(context.instance, name, context.partition_key)
    if metadata is None or "digest" not in metadata:
        raise Failure(description=f"{name} has no materialization for {context.partition_key!r}; materialize {name} first")
    return metadata["digest"]


stage_assets = [build_stage_asset(kind) for kind in UPSTREAM]
