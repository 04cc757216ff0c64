"""One instance, two runs: a run that waits for the training slot says who holds it, a Ctrl-C while it waits (or while it
trains, or evaluates) ends it at once as CANCELED holding nothing, and a run killed outright does not keep the next one
waiting.

The other run that holds the slot is a real run record of the instance with a real claim of the pool's slot, made by the
test process (alive throughout, as the run that trains would be); the runs under test are `factory run` processes.
"""

import json
import os
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from assets.watch import process_tags
from factory.cli.common import dagster_home
from factory.config.pools import EVALUATION_POOL
from factory.config.stages import TRAINING_POOL
from factory.registry import ArtifactStore
from tests.test_cli import factory, small_experiment, started

pytestmark = pytest.mark.e2e


@pytest.fixture
def instance(tmp_path) -> Iterator[DagsterInstance]:
    with DagsterInstance.from_config(str(dagster_home(tmp_path / "state"))) as opened:
        yield opened


def hold_training_slot(instance: DagsterInstance) -> str:
    """Another experiment's run, alive, holding the one training slot; its run id."""
    run_id = str(uuid.uuid4())
    instance.add_run(DagsterRun(job_name="__ephemeral_asset_job__", run_id=run_id, status=DagsterRunStatus.STARTED,
                                tags={"experiment": "teammate", **process_tags()}))
    storage = instance.event_log_storage
    storage.set_concurrency_slots(TRAINING_POOL, 1)
    assert storage.claim_concurrency_slot(TRAINING_POOL, run_id, "pretrain").is_claimed
    return run_id


def read_until(process: subprocess.Popen, pattern: str) -> list[str]:
    """The lines `process` printed up to the first that matches `pattern` (the test fails if it ends first)."""
    lines = []
    for line in process.stdout:
        lines.append(line)
        if re.search(pattern, line):
            return lines
    pytest.fail(f"never printed {pattern!r}:\n" + "".join(lines[-60:]))


def runs_of(instance: DagsterInstance, experiment: str) -> list[DagsterRun]:
    return list(instance.get_runs(filters=RunsFilter(tags={"experiment": experiment})))


def leases_left(root: Path) -> dict[str, str]:
    """The leases left in the registry at `root`, each with its record and whether the process it names is alive."""
    left = {}
    for path in sorted((root / "registry" / "leases").glob("*.lease")):
        record = path.read_text()
        alive = psutil.pid_exists(json.loads(record).get("pid", -1)) if record.strip() else False
        left[path.name] = f"{record} (its process {'alive' if alive else 'gone'})"
    return left


def held(instance: DagsterInstance) -> set[str]:
    """The runs holding a slot of the training pool or waiting in its queue."""
    info = instance.event_log_storage.get_concurrency_info(TRAINING_POOL)
    return {slot.run_id for slot in info.claimed_slots} | {step.run_id for step in info.pending_steps}


def test_runs_stopped_while_waiting_for_the_training_slot_leave_the_pool_to_the_next_run(tmp_path, instance):
    """Ctrl-C in a data stage: CANCELED, no lease left. Ctrl-C while it waits: CANCELED at once, out of the queue. kill -9 while it waits: the next run cancels it and frees
    its place in the queue, which would otherwise be given the slot for good. Then a run trains at once, and a Ctrl-C
    while it trains ends it CANCELED too, saying in one line where training stopped and how to go on from there."""
    path, root = small_experiment(tmp_path), tmp_path / "state"
    data = started("run", str(path), "--root", str(root))  # Ctrl-C in a data stage (or the next: they are quick)
    read_until(data, r"raw_datasets - \[pipes\] external process successfully opened")
    os.killpg(data.pid, signal.SIGINT)
    after, _ = data.communicate(timeout=60)
    assert data.returncode == 130 and "Traceback" not in after, after
    assert [r.status for r in runs_of(instance, "small")] == [DagsterRunStatus.CANCELED]
    assert leases_left(root) == {}

    holder = hold_training_slot(instance)
    run = started("run", str(path), "--root", str(root))
    read_until(run, rf"pretrain: waiting for a slot of pool training, held by teammate \(run {holder[:8]}\)")
    os.killpg(run.pid, signal.SIGINT)
    after, _ = run.communicate(timeout=60)
    assert run.returncode == 130, after
    said = [line for line in after.splitlines() if line.startswith("error:")]
    assert len(said) == 1 and "interrupted while waiting for a slot: pretrain (pool training)" in said[0], after
    assert f"`factory run {path}" in said[0] and "Traceback" not in after
    [stopped] = runs_of(instance, "small")[:1]  # the newest first
    assert stopped.status == DagsterRunStatus.CANCELED and held(instance) == {holder}  # nothing of it left in the queue
    waiting = [e for e in instance.all_logs(stopped.run_id) if "waiting for a slot of pool training" in e.message]
    assert waiting and waiting[0].step_key == "pretrain"  # the run's Dagster log says it too

    killed = started("run", str(path), "--root", str(root))
    read_until(killed, r"pretrain: waiting for a slot of pool training")
    cli = psutil.Process(killed.pid)
    for process in [cli, *cli.children(recursive=True)]:  # kill -9 of every process of it: none can clean up
        process.kill()
    killed.communicate(timeout=60)
    dead = runs_of(instance, "small")[0]
    assert dead.status == DagsterRunStatus.STARTED and dead.run_id in held(instance)  # what wedged the pool before

    instance.event_log_storage.free_concurrency_slots_for_run(holder)  # the teammate's training ends
    again = started("run", str(path), "--root", str(root))
    before = read_until(again, r"pretrain - step 30/100000")  # logged after the checkpoint of step 20 was saved
    assert any(f"run {dead.run_id[:8]} of small was left running by a process that is gone: canceled" in line for line in before)
    assert not [line for line in before if "waiting for a slot" in line]
    os.killpg(again.pid, signal.SIGINT)
    after, _ = again.communicate(timeout=120)
    assert again.returncode == 130, after
    assert {r.status for r in runs_of(instance, "small")} == {DagsterRunStatus.CANCELED}
    # Ctrl-C while it trains says where training stopped, in one line, and how to go on from there.
    assert "Traceback" not in after and "Warning" not in "".join(before) + after
    # Steps the stage logged before the interrupt reached it may follow (more of them on a loaded machine); then one line.
    [said] = [line for line in after.splitlines() if not re.match(r"\d\d:\d\d:\d\d |.* - (INFO|DEBUG) - ", line)]
    assert re.search(r"^error: pretrain: interrupted at step \d+ of 100000; its last checkpoint is step_\d{6}\.pt; "
                     rf"`factory run {re.escape(str(path))} --root {re.escape(str(root.resolve()))}` goes on from there \(full log: .+\)$",
                     said), said
    log = Path(said.rsplit("(full log: ", 1)[1].rstrip(")"))
    assert log.parent == (root / "logs").resolve() and "DagsterExecutionInterruptedError" in log.read_text()
    assert leases_left(root) == {}
    plan = factory("plan", str(path), "--root", str(root), "--json")
    assert {stage["kind"]: stage["status"] for stage in json.loads(plan.stdout)["stages"]}["pretrain"] == "run"
    assert held(instance) == set()


def test_a_run_stopped_while_it_evaluates_is_canceled_holding_nothing_and_the_next_run_evaluates_at_once(tmp_path, instance):
    """Ctrl-C in an evaluation batch (the fourth moment, after a data stage, waiting for a slot and training): exit 130
    with one line, CANCELED, no slot of the evaluation pool, lease or queue entry left; the next run scores the checkpoints."""
    path = small_experiment(tmp_path)
    text = path.read_text().replace("steps: 100000", "steps: 20").replace("checkpoint_every: 20", "checkpoint_every: 10")
    path.write_text(text.replace("\n---\nTrains", "\neval: {benchmarks: [val_bpb, next_line], max_bytes: 20000}\n---\nTrains"))
    root = tmp_path / "state"
    run = started("run", str(path), "--root", str(root))
    read_until(run, r"evaluations - \[pipes\] external process successfully opened")
    os.killpg(run.pid, signal.SIGINT)
    after, _ = run.communicate(timeout=60)
    assert run.returncode == 130 and "Traceback" not in after, after
    said = [line for line in after.splitlines() if line.startswith("error:")]
    assert len(said) == 1 and f"`factory run {path}" in said[0], after
    evaluating, pipeline = instance.get_runs()  # the newest first: the evaluation batch's run, then the experiment's
    assert "|small__pretrain-" in evaluating.tags["dagster/asset_partition_range_start"] and pipeline.tags["experiment"] == "small"
    assert (evaluating.status, pipeline.status) == (DagsterRunStatus.CANCELED, DagsterRunStatus.SUCCESS)
    info = instance.event_log_storage.get_concurrency_info(EVALUATION_POOL)
    assert not info.claimed_slots and not info.pending_steps
    assert leases_left(root) == {}

    again = started("run", str(path), "--root", str(root))
    out, _ = again.communicate(timeout=600)
    assert again.returncode == 0, out
    scored = {m.summary["benchmark"] for m in ArtifactStore(root / "registry").manifests("evaluations")}
    assert scored == {"val_bpb", "next_line"}
