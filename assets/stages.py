"""One asset per stage, partitioned by experiment: hit the registry, or launch the stage process."""


from collections.abc import Iterator
from urllib.parse import quote

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
    DataVersion,
    Failure,
    MaterializeResult,
    MetadataValue,
    PipesExecutionResult,
    asset,
)

from assets.checkpoints import CheckpointRecorder
from assets.partitions import COMMIT_TAG, FILE_TAG, FILE_URL_TAG, FROM_DIGEST_TAG, FROM_TAG, experiments_partitions
from assets.post import ensure_task_set
from assets.records import latest_metadata
from factory.config import Experiment, StageSpec, config_hash, plan_stage, upstream_of
from factory.config.kinds import model_kind, stage_kind, stage_kinds
from factory.config.stages import BASE, placement, pool_of, stages_of
from factory.data.checks import CHECKS
from factory.errors import ConfigError
from factory.ops.bases import Base, bound_with, resolve
from factory.podium.links import table_links
from factory.registry import Manifest, Provenance, Registry, git_commit
from factory.stages.post_training import POST_TRAINING_TASKS
from factory.runtime.context import WARNINGS
from factory.stages.dataset_checks import recorded_checks
from factory.runtime.request import StageRequest
from resources import ExperimentFiles, FactoryStores, StageLauncher

CHECK_DESCRIPTIONS = {
    "non_empty": "Every filtered dataset has documents.",
    "schema": "Every filtered dataset has the document schema.",
    "duplicate_share": "Every filtered dataset's share of exact duplicates is within its bound.",
}
# The dataset checks block everything downstream (blend, tokenizer, training) when they fail.
CHECK_SPECS = {
    kind.name: [AssetCheckSpec(name, asset=kind.name, blocking=True, description=CHECK_DESCRIPTIONS[name]) for name in CHECKS]
    for kind in stage_kinds() if kind.dataset_checks
}


def build_stage_asset(kind: str) -> AssetsDefinition:
    """The asset of one stage kind."""

    declared = stage_kind(kind)

    @asset(
        name=kind,
        partitions_def=experiments_partitions,
        deps=[*declared.reads, *declared.extra_inputs],
        description=declared.description,
        kinds=set(declared.artifact) or None,
        group_name=declared.group,
        check_specs=CHECK_SPECS.get(kind),
        pool=pool_of(kind),  # training stages wait for a slot of the instance's `training` pool (assets/pools.py)
    )
    def stage(
        context: AssetExecutionContext, experiments: ExperimentFiles, stores: FactoryStores, launcher: StageLauncher
    ) -> Iterator[MaterializeResult | PipesExecutionResult | AssetCheckResult]:
        commit = context.run.tags.get(COMMIT_TAG)
        experiment = experiments.load(context.partition_key, commit=commit)
        if source := file_at_commit(context.run.tags):  # the run's page links the file it read (run tags are not links)
            context.add_asset_metadata({"experiment_file": source})
        if kind not in stages_of(experiment):
            raise Failure(description=f"{experiment.name} has no {kind} stage: its file has no section for it")
        registry = stores.registry()
        experiment, base = starting_point(context, experiments, registry, experiment, commit)
        try:  # the raw stage lists its sources' files here: a source gone since `factory check` is the user's to fix
            spec = plan_stage(experiment, kind, {name: upstream_digest(context, name) for name in upstream_of(experiment, kind)
                                                 if name not in experiment.bound})
        except ConfigError as e:
            raise Failure(description=f"{kind}: {e}") from None
        provenance = Provenance(
            experiment=experiment.name, config_hash=config_hash(experiment), git_commit=commit or git_commit(files=[experiment.source] if experiment.source else ()), run_id=context.run_id,
            base=base.record() if base is not None else {},
        )
        if base is not None and BASE in spec.upstream:  # the run's page links the model it starts from
            context.add_asset_metadata(base_links(base, registry))
        if POST_TRAINING_TASKS in declared.extra_inputs:
            ensure_task_set(context, stores, experiment)
        manifest = registry.lookup(spec.fingerprint)
        recorder = CheckpointRecorder(context, experiment, spec, provenance.git_commit) if declared.checkpoints else None
        if manifest is not None:
            context.log.info(f"{kind}: cached from {manifest.experiment} (run {manifest.run_id or 'outside Dagster'}); not recomputed")
            if warnings := manifest.summary.get(WARNINGS):
                context.log.warning(f"{kind}: {warnings}")
            yield MaterializeResult(metadata=cached_metadata(manifest, registry, provenance), data_version=DataVersion(manifest.digest))
        else:
            if holder := registry.holder(spec.fingerprint):
                context.log.info(f"{kind}: awaiting cache: {holder.owner} is computing this stage")
            request = StageRequest(
                spec=spec, registry=str(registry.root), catalog=stores.catalog(), provenance=provenance, **placement_of(experiment, kind)
            )
            yield from launcher.launch(context, request, on_message=recorder.heard if recorder else None, experiment=experiment)
            manifest = registry.lookup(spec.fingerprint)  # once, for the checks and checkpoints below
            if manifest is None:
                raise Failure(description=f"{kind}: the stage reported success but published no artifact")
        if kind in CHECK_SPECS:
            yield from check_results(spec, registry, manifest, stores)
        if recorder is not None:
            keys = recorder.record(registry, manifest)
            recorder.forget_deleted(keys)
            context.log.info(f"{kind}: {len(keys)} kept checkpoints recorded as partitions of `checkpoints`")

    return stage


def file_at_commit(tags: dict[str, str]) -> MetadataValue | None:
    """The experiment file a run from git read: a link to it at its commit on the forge, or its path and commit."""
    if url := tags.get(FILE_URL_TAG):
        return MetadataValue.url(url)
    if (path := tags.get(FILE_TAG)) and (commit := tags.get(COMMIT_TAG)):
        return MetadataValue.text(f"{path} at {commit[:12]}")
    return None


def starting_point(
    context: AssetExecutionContext, experiments: ExperimentFiles, registry: Registry, experiment: Experiment, commit: str | None
) -> tuple[Experiment, Base | None]:
    """The experiment with its `from` resolved as its run was planned (the run's tags pin the model), and what it
    resolved to; unchanged, and None, for an experiment that starts from its own pretraining."""
    if experiment.base is None:
        return experiment, None
    tags = context.run.tags
    pins = {tags[FROM_TAG]: tags[FROM_DIGEST_TAG]} if FROM_TAG in tags and FROM_DIGEST_TAG in tags else None
    try:
        base = resolve(experiment, registry, read=experiments.reader(commit), pins=pins)
    except ConfigError as e:
        raise Failure(description=str(e)) from None
    if base.pending:
        raise Failure(description=f"{experiment.source}: {base.section}.from: {base.said}; `factory run {experiment.source}` runs "
                                  f"{base.file} first")
    return bound_with(experiment, base), base


def base_tags(base: Base | None) -> dict[str, str]:
    """The tags that pin a run to the model its experiment's `from` resolved to when it was planned."""
    return {FROM_TAG: base.ref.text, FROM_DIGEST_TAG: base.digest} if base is not None and not base.pending else {}


def base_links(base: Base, registry: Registry) -> dict[str, MetadataValue]:
    """The model a stage starts from, on its materialization: how `from` resolved, the base experiment's `model` partition
    in the UI and the artifact."""
    links = {"starts_from": MetadataValue.text(base.said), "base_model": MetadataValue.path(registry.where(base.digest))}
    if base.experiment:
        links["base_experiment"] = MetadataValue.url(f"/assets/{model_kind().name}?partition={quote(base.experiment)}")
    return links


def placement_of(experiment: Experiment, kind: str) -> dict:
    """How many ranks the stage process runs as, and the stage-specific placement it is told."""
    where = placement(experiment, kind)
    return {"processes": where.processes, "nodes": where.nodes, "placement": dict(where.roles), "gpus": where.gpus}


def cached_metadata(manifest: Manifest, registry: Registry, provenance: Provenance) -> dict:
    """A registry hit shown as a normal materialization: this run's provenance, and where the artifact came from."""
    return {
        **manifest.metadata(),
        "produced_by_commit": manifest.git_commit,
        "git_commit": provenance.git_commit,
        "config_hash": provenance.config_hash,
        "git_dirty": provenance.git_commit.endswith("-dirty"),
        "cache": "hit",
        "cached_from": f"{manifest.experiment} (run {manifest.run_id or 'outside Dagster'})",
        "artifact": MetadataValue.path(registry.where(manifest.digest)),
        **{name: MetadataValue.url(url) for name, url in table_links(manifest.summary).items()},
    }


def check_results(spec: StageSpec, registry: Registry, manifest: Manifest, stores: FactoryStores) -> Iterator[AssetCheckResult]:
    """The blocking dataset checks of the artifact just materialized, as the stage recorded them in it."""
    for outcome in recorded_checks(stores.catalog(), registry, manifest, spec.kind, dict(spec.config)):
        yield AssetCheckResult(check_name=outcome.name, passed=outcome.passed, description=outcome.description, metadata=outcome.metadata)


def upstream_digest(context: AssetExecutionContext, name: str) -> str:
    """Artifact digest of the upstream stage's latest materialization for this experiment."""
    metadata = latest_metadata(context.instance, name, context.partition_key)
    if metadata is None or "digest" not in metadata:
        raise Failure(description=f"{name} has no materialization for {context.partition_key!r}; materialize {name} first")
    return metadata["digest"]


stage_assets = [build_stage_asset(kind.name) for kind in stage_kinds()]
