"""Runs from git: experiment files at HEAD become partitions and run requests."""

import hashlib

from dagster import (
    AssetKey,
    AssetSelection,
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.partitions import COMMIT_TAG, EXPERIMENTS, SOURCE_TAG, experiments_partitions
from factory.config import STAGES, load_text
from factory.config.loader import read_document
from factory.errors import ConfigError
from factory.preflight import TableLookup, check_variants
from factory.registry.provenance import head_commit
from resources import ExperimentFiles, FactoryStores
from resources.experiments import reader

SENSOR_INTERVAL_S = 30


@sensor(
    name="experiments_at_head",
    target=AssetSelection.assets(*STAGES),
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=SENSOR_INTERVAL_S,
    description="New or changed experiment files at git HEAD become partitions and runs (run key = path + content hash).",
)
def experiments_at_head(context: SensorEvaluationContext, experiments: ExperimentFiles, stores: FactoryStores) -> SensorResult | SkipReason:
    from factory.data.catalog import open_catalog

    commit = head_commit(experiments.directory)
    if commit is None:
        return SkipReason(f"{experiments.directory} is not in a git repository with commits; nothing to run from git")
    if context.cursor == commit:
        return SkipReason(f"HEAD is still {commit[:12]}")
    requests, new = [], []
    texts = experiments.texts(commit)
    tables = TableLookup(lambda: open_catalog(stores.catalog()))
    for path, text in texts.items():
        try:
            variants = load_text(path, text, read=reader(texts))
        except ConfigError as e:
            context.log.warning(f"skipped, does not load: {e}")
            continue
        written = lambda path=path, text=text: read_document(path, text, chain=(), read=reader(texts)).locations  # noqa: E731
        if errors := check_variants(path, variants, tables, locations=written):  # what `factory check` refuses never runs
            context.log.warning("skipped, refused by `factory check`:\n" + "\n".join(errors))
            continue
        content = hashlib.sha256(text.encode()).hexdigest()[:16]
        for experiment in variants:
            if experiment.name not in new and not context.instance.has_dynamic_partition(EXPERIMENTS, experiment.name):
                new.append(experiment.name)
            requests.append(
                RunRequest(
                    run_key=f"{path.name}@{content}#{experiment.name}",
                    partition_key=experiment.name,
                    asset_selection=[AssetKey(stage) for stage in experiment.stages()],
                    tags={COMMIT_TAG: commit, SOURCE_TAG: path.name},
                )
            )
    partitions = [experiments_partitions.build_add_request(new)] if new else []
    return SensorResult(run_requests=requests, dynamic_partitions_requests=partitions, cursor=commit)
