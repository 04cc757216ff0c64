"""The git sensor: files at HEAD become partitions and run requests keyed by path + content hash."""

import subprocess

import pytest
from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context

from assets.partitions import COMMIT_TAG, FILE_TAG, FILE_URL_TAG, MERGE_TAG, SOURCE_TAG
from assets.sensors import experiments_at_head
from factory.cli.common import dagster_home
from factory.config import load
from factory.config.pools import EVALUATION_POOL, POOL_LIMITS, TRAINING_POOL
from factory.config.stages import stages_of
from resources import ExperimentFiles, FactoryStores

SWEEP = """---
extends: base.md
sweep:
  pretrain.lr: [0.001, 0.003]
  tokenizer.vocab_size: [512, 1024]
---
A 2x2 grid.
"""


def git(repo, *args):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True, capture_output=True)


def tick(instance, directory, cursor=None, **files):
    resources = {"experiments": ExperimentFiles(directory=str(directory), **files), "stores": FactoryStores(root=str(directory.parent / ".factory"))}
    context = build_sensor_context(instance=instance, cursor=cursor, resources=resources)
    return experiments_at_head(context)


def local_repo(tmp_path, tiny_path):
    """A local repository whose one commit holds experiments/base.md (the tiny experiment); (repo, experiments)."""
    repo, experiments = tmp_path / "repo", tmp_path / "repo" / "experiments"
    experiments.mkdir(parents=True)
    git(repo, "init", "-q")
    (experiments / "base.md").write_text(tiny_path.read_text())
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    return repo, experiments


def test_sensor_requests_runs_for_new_and_changed_files_at_head(tmp_path, tiny_path):
    repo, experiments = local_repo(tmp_path, tiny_path)
    instance = DagsterInstance.ephemeral()

    first = tick(instance, experiments, run_existing=True)
    [request] = first.run_requests
    assert request.partition_key == "base" and request.run_key.startswith("base.md@")
    assert {k.to_user_string() for k in request.asset_selection} == set(stages_of(load(tiny_path)))
    assert first.dynamic_partitions_requests[0].partition_keys == ["base"]
    assert isinstance(tick(instance, experiments, cursor=first.cursor), SkipReason)

    (experiments / "sweep.md").write_text(SWEEP)
    (experiments / "broken.md").write_text("---\nmodel: [1\n---\n")
    (experiments / "refused.md").write_text("---\nextends: base.md\neval:\n  benchmarks: [no_such_benchmark]\n---\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "sweep")
    (experiments / "base.md").write_text("uncommitted edits are not run\n")
    second = tick(instance, experiments, cursor=first.cursor)
    keys = {r.partition_key: r.run_key for r in second.run_requests}
    assert "base" not in keys  # unchanged since the commit the last tick read: not read again
    assert "refused" not in keys  # loads, but `factory check` refuses it: never started
    sweep_keys = sorted(k for k in keys if k != "base")
    assert sweep_keys == [f"sweep.lr={lr}.vocab_size={v}" for lr in ("0.001", "0.003") for v in ("1024", "512")]
    assert all("|" not in key for key in keys)
    assert second.cursor != first.cursor


def test_a_new_commit_reads_only_the_files_it_adds_or_changes(tmp_path, tiny_path):
    repo, experiments = local_repo(tmp_path, tiny_path)
    for seed, name in enumerate(("a", "b", "c")):
        (experiments / f"{name}.md").write_text(f"---\nextends: base.md\nseed: {seed}\n---\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "three")
    instance = DagsterInstance.ephemeral()
    first = tick(instance, experiments, run_existing=True)
    assert {r.partition_key for r in first.run_requests} == {"base", "a", "b", "c"}

    (experiments / "b.md").write_text("---\nextends: base.md\nseed: 9\n---\n")
    (experiments / "c.md").unlink()
    (experiments / "d.md").write_text("---\nextends: base.md\nseed: 4\n---\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "change b, remove c, add d")
    second = tick(instance, experiments, cursor=first.cursor)
    keys = {r.partition_key: r.run_key for r in second.run_requests}
    assert set(keys) == {"b", "d"}
    assert keys["b"] != {r.partition_key: r.run_key for r in first.run_requests}["b"]


def test_a_file_that_did_not_load_for_want_of_another_runs_once_that_one_comes(tmp_path, tiny_path):
    repo, experiments = local_repo(tmp_path, tiny_path)
    instance = DagsterInstance.ephemeral()
    start = tick(instance, experiments).cursor
    (experiments / "child.md").write_text("---\nextends: parent.md\nseed: 4\n---\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "child of a parent not there yet")
    first = tick(instance, experiments, cursor=start)
    assert not first.run_requests  # it does not load: parent.md is missing
    (experiments / "parent.md").write_text("---\nextends: base.md\nseed: 8\n---\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "the parent")
    second = tick(instance, experiments, cursor=first.cursor)
    assert {r.partition_key for r in second.run_requests} == {"child", "parent"}


def test_a_file_refused_for_an_alias_that_names_nothing_yet_waits_and_runs_once_it_does(tmp_path, tiny_path):
    from factory.ops.promote import promote
    from factory.registry import ArtifactStore
    from tests.ops.test_bases import SFT, made_model

    repo, experiments = local_repo(tmp_path, tiny_path)
    instance = DagsterInstance.ephemeral()
    start = tick(instance, experiments).cursor
    (experiments / "ft.md").write_text(SFT.format(ref="alias:production"))
    (experiments / "wrong.md").write_text("---\nextends: base.md\neval:\n  benchmarks: [no_such_benchmark]\n---\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "a fine-tune of whatever production names, and a file refused for itself")
    first = tick(instance, experiments, cursor=start)
    assert isinstance(first, SensorResult) and not first.run_requests  # the alias names no model yet
    assert "ft.md" in first.cursor and "wrong.md" not in first.cursor  # it waits; the file refused for itself does not
    waiting = tick(instance, experiments, cursor=first.cursor)
    assert not waiting.run_requests and waiting.cursor == first.cursor  # the same commit: still waiting, asked again
    registry = ArtifactStore(experiments.parent / ".factory" / "registry")
    made_model(registry, "base", "a")
    promote(registry, next(registry.manifests("model")), "production", "first", "test", "none")
    ran = tick(instance, experiments, cursor=waiting.cursor)
    assert [r.partition_key for r in ran.run_requests] == ["ft"]  # the same commit, run now that the alias names a model
    assert "ft.md" not in ran.cursor


def test_sensor_skips_outside_git(tmp_path):
    assert isinstance(tick(DagsterInstance.ephemeral(), tmp_path), SkipReason)


def test_first_tick_starts_from_head_and_runs_nothing(tmp_path, tiny_path):
    repo, experiments = local_repo(tmp_path, tiny_path)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()

    first = tick(DagsterInstance.ephemeral(), experiments)
    assert isinstance(first, SensorResult) and not first.run_requests and first.cursor == head
    assert f"starting from commit {head[:12]}" in first.skip_reason.skip_message
    assert "FACTORY_SENSOR_RUN_EXISTING=1" in first.skip_reason.skip_message


@pytest.fixture
def remote(tmp_path, tiny_path):
    """A bare repository standing in for the remote, and a working clone that pushes to it (with base.md on main)."""
    bare, work = tmp_path / "remote.git", tmp_path / "work"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(bare))
    git(tmp_path, "clone", "-q", str(bare), str(work))
    git(work, "checkout", "-q", "-b", "main")
    (work / "experiments").mkdir()
    (work / "experiments" / "base.md").write_text(tiny_path.read_text())
    push(work, "base")
    return bare, work


def push(work, message, *extra):
    git(work, "add", "-A")
    git(work, "commit", "-qm", message)
    git(work, "push", "-q", *extra, "origin", "main")
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=work, capture_output=True, text=True, check=True).stdout.strip()


def remote_tick(instance, tmp_path, remote_url, cursor=None, branch="main"):
    files = {"remote": str(remote_url), "branch": branch, "clone": str(tmp_path / ".factory" / "sensor-clone")}
    return tick(instance, tmp_path / "checkout" / "experiments", cursor=cursor, **files)


def test_sensor_follows_a_remote_branch(tmp_path, remote):
    bare, work = remote
    instance = DagsterInstance.ephemeral()
    first = remote_tick(instance, tmp_path, bare)  # the sensor's own clone; no checkout of the user's is read
    assert not first.run_requests and first.cursor == subprocess.run(
        ["git", "rev-parse", "main"], cwd=bare, capture_output=True, text=True).stdout.strip()
    assert not (tmp_path / "checkout").exists()

    (work / "experiments" / "more.md").write_text("---\nextends: base.md\nseed: 7\n---\nAnother seed.\n")
    git(work, "checkout", "-q", "-b", "feature")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "more")
    git(work, "checkout", "-q", "main")
    git(work, "-c", "core.editor=true", "merge", "-q", "--no-ff", "feature", "-m", "Merge pull request #1")
    git(work, "push", "-q", "origin", "main")
    merge = subprocess.run(["git", "rev-parse", "HEAD"], cwd=work, capture_output=True, text=True).stdout.strip()
    second = remote_tick(instance, tmp_path, bare, cursor=first.cursor)
    by_file = {r.tags[SOURCE_TAG]: r for r in second.run_requests}
    assert set(by_file) == {"more.md"}  # base.md was there when the sensor started: never run
    more = by_file["more.md"]
    assert more.partition_key == "more" and second.cursor == merge
    assert more.tags[COMMIT_TAG] == merge and more.tags[FILE_TAG] == "experiments/more.md" and more.tags[MERGE_TAG] == merge
    assert FILE_URL_TAG not in more.tags  # a path remote has no web page
    assert isinstance(remote_tick(instance, tmp_path, bare, cursor=second.cursor), SkipReason)


def test_unreachable_remote_or_missing_branch_warns_and_keeps_the_cursor(tmp_path, remote):
    bare, _ = remote
    instance = DagsterInstance.ephemeral()
    cursor = remote_tick(instance, tmp_path, bare).cursor
    missing = remote_tick(instance, tmp_path, tmp_path / "nowhere.git", cursor=cursor)
    assert isinstance(missing, SkipReason) and "cannot reach" in missing.skip_message and "FACTORY_GIT_REMOTE" in missing.skip_message
    no_branch = remote_tick(instance, tmp_path, bare, cursor=cursor, branch="nope")
    assert isinstance(no_branch, SkipReason) and "FACTORY_GIT_BRANCH" in no_branch.skip_message
    assert cursor[:12] in no_branch.skip_message  # a SkipReason leaves the cursor as it was


def test_force_push_reads_the_new_tip(tmp_path, remote, capsys):
    bare, work = remote
    instance = DagsterInstance.ephemeral()
    start = remote_tick(instance, tmp_path, bare).cursor
    (work / "experiments" / "gone.md").write_text("---\nextends: base.md\nseed: 3\n---\n")
    pushed = push(work, "gone")
    assert {r.partition_key for r in remote_tick(instance, tmp_path, bare, cursor=start).run_requests} == {"gone"}
    git(work, "reset", "-q", "--hard", "HEAD~1")
    (work / "experiments" / "kept.md").write_text("---\nextends: base.md\nseed: 5\n---\n")
    rewritten = push(work, "kept", "--force")
    after = remote_tick(instance, tmp_path, bare, cursor=pushed)
    assert after.cursor == rewritten
    assert f"was rewritten (force-push): {pushed[:12]}" in capsys.readouterr().err  # the tick's warning
    assert {r.partition_key for r in after.run_requests} == {"base", "kept"}  # the old tip is not in the new history: all read



def test_each_tick_gives_a_deployed_instance_its_pool_limits(tmp_path, tiny_path, monkeypatch):
    """Nobody runs `python -m assets.pools` on a deployed instance: the sensor's tick applies the limits there."""
    monkeypatch.delenv("FACTORY_DATABASE_URL", raising=False)
    monkeypatch.setenv("FACTORY_POOL_TRAINING", "3")
    _, experiments = local_repo(tmp_path, tiny_path)
    with DagsterInstance.from_config(str(dagster_home(tmp_path / "state"))) as instance:
        tick(instance, experiments)
        storage = instance.event_log_storage
        assert {pool: storage.get_concurrency_info(pool).slot_count for pool in POOL_LIMITS} == {TRAINING_POOL: 3, EVALUATION_POOL: 2}
