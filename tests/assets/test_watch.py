"""What a `factory run` sets right before it starts: runs whose process is gone, and pool slots held by runs that are over."""

import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus

from assets.watch import HOST_TAG, PID_TAG, START_TAG, _started, give_free_slots, process_tags, reap, waiting_steps
from factory.cli.common import dagster_home
from factory.config.stages import TRAINING_POOL


@pytest.fixture
def instance(tmp_path, monkeypatch):
    monkeypatch.delenv("FACTORY_DATABASE_URL", raising=False)
    with DagsterInstance.from_config(str(dagster_home(tmp_path))) as opened:
        opened.event_log_storage.set_concurrency_slots(TRAINING_POOL, 1)
        yield opened


def a_run(instance: DagsterInstance, tags: dict[str, str], status=DagsterRunStatus.STARTED, experiment: str = "x") -> str:
    run_id = str(uuid.uuid4())
    instance.add_run(DagsterRun(job_name="job", run_id=run_id, status=status, tags={"experiment": experiment, **tags}))
    return run_id


def dead_process_tags() -> dict[str, str]:
    probe = subprocess.Popen(["true"])
    probe.wait()  # its pid names no process now
    return {PID_TAG: str(probe.pid), HOST_TAG: socket.gethostname(), START_TAG: "1"}


def test_a_run_whose_process_is_gone_is_canceled_and_its_place_in_the_queue_freed(instance):
    storage = instance.event_log_storage
    alive = a_run(instance, process_tags(), experiment="teammate")
    dead = a_run(instance, dead_process_tags(), experiment="mine")
    assert storage.claim_concurrency_slot(TRAINING_POOL, alive, "pretrain").is_claimed
    assert not storage.claim_concurrency_slot(TRAINING_POOL, dead, "pretrain").is_claimed  # queued behind the alive one
    assert waiting_steps(instance, dead) == {("pretrain", TRAINING_POOL): f"teammate (run {alive[:8]})"}

    said = reap(instance)
    assert said == [f"run {dead[:8]} of mine was left running by a process that is gone: canceled"]
    assert instance.get_run_by_id(dead).status == DagsterRunStatus.CANCELED
    assert instance.get_run_by_id(alive).status == DagsterRunStatus.STARTED
    info = storage.get_concurrency_info(TRAINING_POOL)
    assert {slot.run_id for slot in info.claimed_slots} == {alive} == {step.run_id for step in info.pending_steps}


def test_a_killed_process_its_parent_has_not_reaped_yet_is_gone(instance):
    probe = subprocess.Popen(["sleep", "60"])
    tags = {PID_TAG: str(probe.pid), HOST_TAG: socket.gethostname(), START_TAG: _started(probe.pid)}
    run = a_run(instance, tags)
    assert reap(instance) == [] and instance.get_run_by_id(run).status == DagsterRunStatus.STARTED
    probe.kill()
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{probe.pid}/stat").read_text().split(")")[1].split()[0] != "Z":  # killed, not waited for: a zombie
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert reap(instance) == [f"run {run[:8]} of x was left running by a process that is gone: canceled"]
    finally:
        probe.wait()


def test_slots_held_by_a_finished_or_unknown_run_are_given_back(instance):
    storage = instance.event_log_storage
    finished = a_run(instance, {}, status=DagsterRunStatus.FAILURE)
    assert storage.claim_concurrency_slot(TRAINING_POOL, finished, "pretrain").is_claimed
    unknown = str(uuid.uuid4())
    assert not storage.claim_concurrency_slot(TRAINING_POOL, unknown, "pretrain").is_claimed
    said = reap(instance)
    assert sorted(said) == sorted([f"freed the pool slots run {finished[:8]} still held (failure)",
                                   f"freed the pool slots run {unknown[:8]} still held (gone)"])
    info = storage.get_concurrency_info(TRAINING_POOL)
    assert info.claimed_slots == [] and info.pending_steps == []
    assert reap(instance) == []


def test_a_run_on_another_machine_is_left_alone(instance):
    other = a_run(instance, {PID_TAG: "1", HOST_TAG: "another-host", START_TAG: "1"})
    assert reap(instance) == []
    assert instance.get_run_by_id(other).status == DagsterRunStatus.STARTED


def test_a_slot_freed_as_a_step_joins_the_queue_is_given_to_it_not_left_to_nobody(instance):
    """Dagster decides whether a joining step gets a free slot before it joins, and gives slots to waiting steps only as
    one is freed: a slot freed in between goes to nobody (seen once in the daemon test: a training waited for good beside
    a free slot). The race, made in order on the instance's own storage, then put right."""
    storage = instance.event_log_storage
    holder, joiner = a_run(instance, process_tags(), experiment="c"), a_run(instance, process_tags(), experiment="d")
    assert storage.claim_concurrency_slot(TRAINING_POOL, holder, "pretrain").is_claimed
    assert not storage.has_unassigned_slots(TRAINING_POOL)  # what the joining step sees: no free slot
    storage.free_concurrency_slot_for_step(holder, "pretrain")  # the holder's step ends: nobody is waiting yet
    storage.add_pending_step(TRAINING_POOL, joiner, "pretrain", should_assign=False)  # joins as it decided
    assert not storage.claim_concurrency_slot(TRAINING_POOL, joiner, "pretrain").is_claimed  # and would wait for good
    assert waiting_steps(instance, joiner) == {("pretrain", TRAINING_POOL): "nobody yet"}
    assert give_free_slots(instance) == [f"gave 1 free slot of pool {TRAINING_POOL} to the steps waiting for it"]
    assert storage.claim_concurrency_slot(TRAINING_POOL, joiner, "pretrain").is_claimed
    # A slot held is not given: the step waiting behind it waits.
    third = a_run(instance, process_tags(), experiment="e")
    assert not storage.claim_concurrency_slot(TRAINING_POOL, third, "pretrain").is_claimed
    assert give_free_slots(instance) == [] and not storage.claim_concurrency_slot(TRAINING_POOL, third, "pretrain").is_claimed
