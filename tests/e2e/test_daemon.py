"""Merge to run under the real daemon: `factory ui` (dagster dev: webserver, daemon, code server) follows a bare git
repository standing in for the remote; commits pushed to it become runs that the daemon launches, queues and finishes."""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.definitions.instigation_logger import get_instigation_log_records
from dagster._core.scheduler.instigation import InstigatorType

from assets.partitions import COMMIT_TAG, FILE_TAG, MERGE_TAG
from factory.cli.common import dagster_home
from factory.config.stages import STAGES
from factory.registry import ArtifactStore
from tests.e2e.test_shared_instance import hold_training_slot
from tests.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
PHASE_TIMEOUT_S = 420  # a phase's runs, on a 2-core machine beside the rest of the suite
EXPERIMENT = """\
---
image: local
seed: 5
data:
  datasets:
    src:
      source: {{kind: directory, path: "{source}"}}
  blend:
    - {{dataset: src, weight: 1, mode: oversample}}
  validation_percent: 10
tokenizer: {{vocab_size: {vocab}, min_frequency: 2, sample_bytes: 200000}}
model: {{n_layer: 1, n_head: 2, n_embd: 32, context: 32}}
pretrain: {{steps: 20, batch_size: 4, lr: {lr}, warmup_steps: 2, checkpoint_every: 10, keep_last: 2, log_every: 10}}
eval: null
---
One thin layer on a copy of the json package, not evaluated: the daemon's runs are what is tested.
"""
DATA_STAGES = {"raw_datasets", "deduped_datasets", "filtered_datasets", "blend", "tokenizer"}
FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True, capture_output=True, text=True)
    return done.stdout.strip()


class Factory:
    """`factory ui` on a root of its own, following `remote`'s main branch; the instance it runs on, read from here."""

    def __init__(self, root: Path, remote: Path, log: Path):
        self.root, self.remote, self.log = root, remote, log
        self.instance = DagsterInstance.from_config(str(dagster_home(root)))
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        env = {key: value for key, value in os.environ.items() if key not in ("FACTORY_DATABASE_URL", "FACTORY_CLUSTER")}
        env.update(FACTORY_GIT_REMOTE=str(self.remote), FACTORY_GIT_BRANCH="main", FACTORY_EXPERIMENTS="experiments",
                   FACTORY_SENSOR_INTERVAL_S="2", FACTORY_TRACKER="none")
        with open(self.log, "a") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "factory", "ui", "--root", str(self.root), "--port", str(free_port())],
                                            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)

    def watch_stages(self) -> dict[int, str]:
        """From now until `stop`, a tenth of a second apart: each stage process `factory ui` has under it, by pid: "cold"
        (`python -m factory.runtime`) or "forked" (a child of the warm interpreter, whose command line it keeps)."""
        seen: dict[int, str] = {}

        def look() -> None:
            while self.process is not None:
                with contextlib.suppress(psutil.Error, AssertionError):
                    for process in self.started_by_it():
                        if process.pid in seen:
                            continue
                        parent = process.parent()  # None once the process has gone and been reaped
                        if "factory.runtime" in process.cmdline():
                            seen[process.pid] = "cold"
                        elif parent is not None and "factory.launch.warm_server" in parent.cmdline():
                            seen[process.pid] = "forked"
                time.sleep(0.1)

        threading.Thread(target=look, daemon=True).start()
        return seen

    def started_by_it(self) -> list[psutil.Process]:
        """Every process `factory ui` started, however deep (Dagster's own are in a process group of their own)."""
        assert self.process is not None
        return psutil.Process(self.process.pid).children(recursive=True)

    def stop(self) -> None:
        """SIGTERM to `factory ui` alone, as a service manager or a pod's stop sends it: it exits 0 and stops every process
        it started (webserver, daemon, code servers; run workers and their stages too: Dagster starts them all in the
        process group it was started in)."""
        if self.process is None:
            return
        started_by_it, process = self.started_by_it(), self.process
        self.process = None
        os.kill(process.pid, signal.SIGTERM)
        code = process.wait(timeout=120)
        _, alive = psutil.wait_procs(started_by_it, timeout=30)
        left = [p for p in alive if running(p)]
        for leftover in left:  # not to leave them running after a failure
            leftover.kill()
        assert left == [], f"processes left after `factory ui` was stopped: {commands(left)}\n{self.log.read_text()[-3000:]}"
        assert code == 0

    def ticks(self) -> list:
        """The experiments sensor's ticks, newest first."""
        states = [s for s in self.instance.all_instigator_state(instigator_type=InstigatorType.SENSOR) if s.name == "experiments_at_head"]
        return [tick for state in states for tick in self.instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=200)]

    def tick_messages(self, level: str) -> list[str]:
        return [record["msg"] for tick in self.ticks() if tick.log_key
                for record in get_instigation_log_records(self.instance, tick.log_key) if record.get("levelname") == level]

    def runs_of(self, *files: str) -> dict[str, list]:
        """{file: its runs started from git}, oldest first."""
        return {name: list(reversed(self.instance.get_runs(RunsFilter(tags={FILE_TAG: f"experiments/{name}"})))) for name in files}

    def wait_for(self, what: str, ready, timeout_s: float = PHASE_TIMEOUT_S):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if found := ready():
                return found
            if self.process is not None and self.process.poll() is not None:
                break
            time.sleep(1)
        pytest.fail(f"{what} did not happen; factory ui said:\n{self.log.read_text()[-4000:]}")

    def finished(self, counts: dict[str, int]) -> dict[str, list]:
        """Wait until each file has `counts[file]` runs and all have finished; the runs, each succeeded."""
        def done():
            runs = self.runs_of(*counts)
            complete = all(len(runs[name]) >= n and all(r.status in FINISHED for r in runs[name]) for name, n in counts.items())
            return runs if complete else None

        runs = self.wait_for(f"runs of {counts}", done)
        for name, rs in runs.items():
            assert len(rs) == counts[name], f"{name}: {len(rs)} runs, expected {counts[name]}"
            for run in rs:
                assert run.status == DagsterRunStatus.SUCCESS, f"{name}: run {run.run_id} {run.status}:\n{self.failure(run.run_id)}"
        return runs

    def failure(self, run_id: str) -> str:
        logs = self.instance.all_logs(run_id)
        return "\n".join(e.message or "" for e in logs if e.dagster_event and e.dagster_event.is_failure)[-3000:]

    def stages(self, run_id: str) -> tuple[set[str], set[str]]:
        """(stages the run computed, stages it found in the registry), from its materialization events."""
        computed, cached = set(), set()
        for entry in self.instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION):
            materialization = entry.dagster_event.event_specific_data.materialization
            kind = materialization.asset_key.to_user_string()
            if kind in STAGES:
                # found before the stage process started, or by it after waiting on another run's lease
                hit = "cached_from" in materialization.metadata or getattr(materialization.metadata.get("cache"), "value", "") == "hit"
                (cached if hit else computed).add(kind)
        return computed, cached

    def compute_window(self, run_id: str, kind: str) -> tuple[float, float]:
        """When the stage process of the run computed `kind`: its artifact's publication (to the second) less the work it
        reported. A step holds a slot of its pool from before the process starts until after it publishes."""
        [manifest] = [m for m in ArtifactStore(self.root / "registry").manifests(kind) if m.run_id == run_id]
        published = datetime.fromisoformat(manifest.created).timestamp()
        return published - manifest.summary["wall_seconds"], published

    def engine_messages(self, run_id: str) -> list[str]:
        return [e.message for e in self.instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT) if e.message]


@pytest.fixture
def remote(tmp_path):
    """A bare repository with one commit on main (no experiments yet), and a working clone that pushes to it."""
    bare, work = tmp_path / "remote.git", tmp_path / "work"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(bare))
    git(tmp_path, "clone", "-q", str(bare), str(work))
    git(work, "checkout", "-q", "-b", "main")
    (work / "README.md").write_text("Experiments, merged to run.\n")
    commit(work, "start")
    return bare, work


def running(process: psutil.Process) -> bool:
    """Whether `process` is still there and not a zombie (dead, waiting for its parent)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def commands(processes: list[psutil.Process]) -> str:
    """The command lines of those of `processes` still there."""
    said = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            said.append(" ".join(process.cmdline()))
    return "; ".join(said)


def commit(work: Path, message: str) -> str:
    git(work, "add", "-A")
    git(work, "commit", "-qm", message)
    git(work, "push", "-q", "origin", "main")
    return git(work, "rev-parse", "HEAD")


@pytest.fixture
def factory(tmp_path, remote, monkeypatch):
    monkeypatch.delenv("FACTORY_DATABASE_URL", raising=False)  # the embedded instance
    running = Factory(tmp_path / "root", remote[0], tmp_path / "factory-ui.log")
    try:
        yield running
    finally:
        running.stop()


def test_merged_experiments_run_under_the_daemon_one_training_at_a_time(tmp_path, remote, factory):
    _, work = remote
    source = tmp_path / "source"
    shutil.copytree(Path(sysconfig.get_paths()["stdlib"]) / "json", source / "json", ignore=shutil.ignore_patterns("__pycache__"))
    experiments = work / "experiments"
    experiments.mkdir()

    def write(name: str, lr: float = 0.003, vocab: int = 300) -> None:
        (experiments / name).write_text(EXPERIMENT.format(source=source, lr=lr, vocab=vocab))

    factory.start()
    stages = factory.watch_stages()
    start = git(work, "rev-parse", "HEAD")
    factory.wait_for("the sensor's first tick", lambda: any(t.cursor == start for t in factory.ticks()))
    names = commands(factory.started_by_it())
    assert "dagster_webserver" in names and "dagster._daemon" in names and "code-server" in names, names
    assert not factory.instance.get_runs(), "a new sensor runs nothing already on the branch"

    # 1. A pull request adds a.md; its merge commit reaches main: the daemon runs it, the registry holds its model.
    git(work, "checkout", "-q", "-b", "add-a")
    write("a.md")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "add a")
    brought = git(work, "rev-parse", "HEAD")
    git(work, "checkout", "-q", "main")
    git(work, "merge", "-q", "--no-ff", "-m", "Merge pull request #1: add a", "add-a")
    git(work, "push", "-q", "origin", "main")
    merge = git(work, "rev-parse", "HEAD")
    [first] = factory.finished({"a.md": 1})["a.md"]
    assert first.tags[COMMIT_TAG] == merge and first.tags[MERGE_TAG] == merge != brought
    computed, _ = factory.stages(first.run_id)
    assert computed == {*DATA_STAGES, "pretrain", "model"}
    [model] = [m for m in ArtifactStore(factory.root / "registry").manifests() if m.kind == "model" and m.run_id == first.run_id]
    assert model.experiment == "a" and model.git_commit == merge
    materialization = factory.instance.get_latest_materialization_event(AssetKey("model")).asset_materialization
    assert materialization.metadata["experiment_file"].value == f"experiments/a.md at {merge[:12]}"

    # 2. One merge, four files, so that the daemon runs them side by side:
    # - a's learning rate changes: only the stages that read it compute again;
    # - b is a's first recipe under another name: every stage is already in the registry;
    # - a broken file: the good ones run, the broken one is a warning on the tick with file:line;
    # - c and d share a new tokenizer: it is computed once (the lease), and the trainings (a's, c's, d's) take the one slot
    #   of the `training` pool in turn, the waiting ones saying why.
    write("a.md", lr=0.002)
    write("b.md")
    (experiments / "broken.md").write_text("---\nmodel: [1\n---\n")
    for name, lr in (("c.md", 0.001), ("d.md", 0.004)):
        write(name, lr=lr, vocab=310)
    holder = hold_training_slot(factory.instance)  # a teammate's training holds the slot until the trainings queue behind it
    commit(work, "a: lower lr; b, c, d and a broken file")
    factory.wait_for("a training of the merge waiting for the held slot", lambda: [
        run for runs in factory.runs_of("a.md", "c.md", "d.md").values() for run in runs
        if any("blocked by limit for pool training" in m for m in factory.engine_messages(run.run_id))])
    factory.instance.event_log_storage.free_concurrency_slots_for_run(holder)  # the teammate's training ends
    factory.instance.report_run_canceled(factory.instance.get_run_by_id(holder))
    runs = factory.finished({"a.md": 2, "b.md": 1, "c.md": 1, "d.md": 1})
    second, [b], [c], [d] = runs["a.md"][1], runs["b.md"], runs["c.md"], runs["d.md"]
    assert factory.stages(second.run_id) == ({"pretrain", "model"}, DATA_STAGES)
    assert factory.stages(b.run_id) == (set(), {*DATA_STAGES, "pretrain", "model"})
    warnings = factory.tick_messages("WARNING")
    assert any(re.search(r"skipped, does not load: experiments/broken\.md:3: invalid YAML", message) for message in warnings), warnings
    assert not factory.runs_of("broken.md")["broken.md"]
    tokenizers = [run for run in (c, d) if "tokenizer" in factory.stages(run.run_id)[0]]
    assert len(tokenizers) == 1 and all("pretrain" in factory.stages(run.run_id)[0] for run in (c, d))
    trainings = (second, c, d)
    windows = sorted(factory.compute_window(run.run_id, "pretrain") for run in trainings)
    assert all(earlier[1] <= later[0] + 1 for earlier, later in zip(windows, windows[1:])), windows  # `created` is to the second

    # Every stage forked from the warm interpreter `factory ui` started, not from a cold `python -m factory.runtime`.
    assert "forked" in stages.values() and "cold" not in stages.values(), stages

    # A restarted daemon does not start the same commit's runs again (and the stop leaves none of the processes behind).
    from_git = lambda: [run.run_id for run in factory.instance.get_runs() if run.tags.get(FILE_TAG)]  # noqa: E731
    before = from_git()
    factory.stop()
    restarted = time.time()
    factory.start()
    factory.wait_for("two ticks after the restart", lambda: len([t for t in factory.ticks() if t.timestamp > restarted]) >= 2)
    assert from_git() == before
