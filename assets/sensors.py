"""Runs from git: experiment files at HEAD become partitions and run requests."""

import hashlib
import json
import os
from pathlib import Path

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

from assets.partitions import COMMIT_TAG, EXPERIMENTS, FILE_TAG, FILE_URL_TAG, MERGE_TAG, SOURCE_TAG, experiments_partitions
from assets.pools import configure_pools
from assets.stages import base_tags
from factory.config import STAGES, load_text
from factory.config.loader import read_document, reader
from factory.config.stages import stages_of
from factory.errors import ConfigError
from factory.ops.bases import resolve
from factory.preflight import TableLookup, check_variants
from factory.registry.provenance import head_commit, repo_root
from factory.registry.remote import RemoteError, bringing_commit, file_url, is_ancestor
from resources import ExperimentFiles, FactoryStores

INTERVAL_ENV = "FACTORY_SENSOR_INTERVAL_S"
SENSOR_INTERVAL_S = int(os.environ.get(INTERVAL_ENV, "") or 30)  # seconds between ticks; read when the code location loads


@sensor(
    name="experiments_at_head",
    target=AssetSelection.assets(*STAGES),
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=SENSOR_INTERVAL_S,
    description="New or changed experiment files at git HEAD (of $FACTORY_GIT_REMOTE's branch when set) become partitions "
    "and runs (run key = path + content hash); a new sensor starts after the files already there. A file whose `from` names "
    "a model not made yet, or that pins a table version or names an alias that does not exist yet, waits, and is run on "
    "the first tick after it does.",
)
def experiments_at_head(context: SensorEvaluationContext, experiments: ExperimentFiles, stores: FactoryStores) -> SensorResult | SkipReason:
    from factory.data.catalog import open_catalog

    try:  # the instance's pools get their limits on a deployed instance too, before anything of this tick runs
        configure_pools(context.instance, os.environ)
    except ConfigError as e:
        context.log.warning(f"pool limits not applied: {e}")
    remote = experiments.remote_url()
    if remote is None:
        commit = head_commit(experiments.directory)
        if commit is None:
            return SkipReason(f"{experiments.directory} is not in a git repository with commits; nothing to run from git")
    else:
        try:
            commit = experiments.fetch()
        except RemoteError as e:
            context.log.warning(str(e))
            return SkipReason(f"{e}; nothing run, cursor kept at {(context.cursor or 'none')[:12]}")
    seen, waiting = read_cursor(context.cursor)
    if seen == commit and not waiting:
        return SkipReason(f"HEAD is still {commit[:12]}")
    if seen is None and not experiments.runs_existing():
        message = (f"starting from commit {commit[:12]}: files already there are not run; `factory run` runs one, "
                   "or set FACTORY_SENSOR_RUN_EXISTING=1")
        context.log.info(message)
        return SensorResult(skip_reason=message, cursor=commit)
    if remote and seen and seen != commit and not is_ancestor(experiments.clone_dir(), seen, commit):
        context.log.warning(f"{experiments.branch_name()} of {remote} was rewritten (force-push): {seen[:12]} is not "
                            f"in the history of {commit[:12]}; reading {commit[:12]}, files unchanged since are not run again")
    root = experiments.clone_dir().resolve() if remote else repo_root(experiments.directory)
    requests, new, still = [], [], []
    texts = experiments.texts(commit)
    # A new commit: the files it adds or changes since the last one read, and the files that name those (every file on a
    # first tick, or when the branch was rewritten); the same commit: neither. Both: the files that wait for a base
    # model another file makes.
    again = seen == commit
    changed = experiments.changed(seen, commit, texts) if seen is not None and not again else None
    tables = TableLookup(lambda: open_catalog(stores.catalog()))
    registry, read = stores.registry(patient=False), reader(texts)
    for path, text in texts.items():
        shown = _in_repo(str(path), root)
        if (again or changed is not None and path.resolve() not in changed) and shown not in waiting:
            continue
        try:
            variants = load_text(path, text, read=reader(texts))
        except ConfigError as e:
            context.log.warning(f"skipped, does not load: {_in_repo(str(e), root)}")
            continue
        written = lambda path=path, text=text: read_document(path, text, chain=(), read=reader(texts)).locations  # noqa: E731
        if errors := check_variants(path, variants, tables, locations=written, bases=lambda e: resolve(e, registry, read=read)):
            # Refused only for what is outside the file (a pinned table version not written yet, an alias naming nothing
            # yet): it waits, and is checked again on every tick until what it names exists. Refused for the file itself:
            # skipped until the file changes.
            outside = not check_variants(path, variants, None, locations=written)
            if not again:
                context.log.warning(f"{'waits, refused for now' if outside else 'skipped, refused'} by `factory check`:\n"
                                    + "\n".join(_in_repo(error, root) for error in errors))
            if outside:
                still.append(shown)
            continue
        content = hashlib.sha256(text.encode()).hexdigest()[:16]  # what `factory check` refuses never runs (above)
        for experiment in variants:
            base = resolve(experiment, registry, read=read)
            if base is not None and base.pending:  # its run would fail at once: the model it starts from is not made yet
                if not again:
                    context.log.info(f"{experiment.name} waits: {base.section}.from: {base.said}; it runs once that model is made")
                still.append(shown)
                continue
            if experiment.name not in new and not context.instance.has_dynamic_partition(EXPERIMENTS, experiment.name):
                new.append(experiment.name)
            requests.append(
                RunRequest(
                    run_key=f"{path.name}@{content}#{experiment.name}",
                    partition_key=experiment.name,
                    asset_selection=[AssetKey(stage) for stage in stages_of(experiment)],
                    tags={**_tags(root, remote, commit, path), **base_tags(base)},
                )
            )
    partitions = [experiments_partitions.build_add_request(new)] if new else []
    return SensorResult(run_requests=requests, dynamic_partitions_requests=partitions, cursor=write_cursor(commit, still))


def read_cursor(cursor: str | None) -> tuple[str | None, tuple[str, ...]]:
    """(the commit read last, the files of it that wait for a base model): a cursor is the commit, then the waiting
    files as a JSON list when there are any."""
    if not cursor:
        return None, ()
    commit, _, rest = cursor.partition(" ")
    try:
        waiting = json.loads(rest) if rest else []
    except json.JSONDecodeError:
        waiting = []
    return commit, tuple(str(path) for path in waiting) if isinstance(waiting, list) else ()


def write_cursor(commit: str, waiting: list[str]) -> str:
    """The cursor after a tick that read `commit`, left `waiting` (paths in the repository) waiting."""
    return f"{commit} {json.dumps(sorted(set(waiting)))}" if waiting else commit


def _in_repo(message: str, root: Path) -> str:
    """`message` with the repository's root (the sensor's clone) left out of its paths: `experiments/x.md:3`, as in the
    pull request."""
    return message.replace(f"{root}/", "")


def _tags(root: Path, remote: str | None, commit: str, path: Path) -> dict[str, str]:
    """The run's tags: the commit read, the file, the commit that brought it and, on a forge, the file's URL there."""
    name = path.resolve().relative_to(root).as_posix()
    merge = bringing_commit(root, commit, name)
    tags = {COMMIT_TAG: commit, SOURCE_TAG: path.name, FILE_TAG: name, MERGE_TAG: merge}
    if remote and (url := file_url(remote, commit, name)):
        tags[FILE_URL_TAG] = url
    return tags
