"""Run queues that fit the machine: training stages and evaluations take slots of the instance's pools."""

import threading
import time

import pytest
from dagster import (
    AssetKey, DagsterEventType, DagsterInstance, EventRecordsFilter, asset, execute_job, job, materialize, multiprocess_executor, op,
    reconstructable,
)

from assets.definitions import defs
from assets.pools import apply_pool_limits, pool_limits
from factory.cli.common import dagster_home
from factory.config.cluster import load_profile
from factory.config.pools import EVALUATION_POOL, POOL_LIMITS, TRAINING_POOL
from factory.config.stages import STAGES, TRAINING_STAGES
from factory.errors import ConfigError


def test_training_stages_and_evaluations_declare_their_pools():
    graph = defs.resolve_asset_graph()
    pools = {kind: graph.get(AssetKey(kind)).pools for kind in STAGES}
    assert pools == {kind: {TRAINING_POOL} if kind in TRAINING_STAGES else set() for kind in STAGES}
    assert graph.get(AssetKey("evaluations")).pools == {EVALUATION_POOL}


@pytest.fixture
def embedded(tmp_path, monkeypatch):
    monkeypatch.delenv("FACTORY_DATABASE_URL", raising=False)
    with DagsterInstance.from_config(str(dagster_home(tmp_path))) as instance:
        yield instance


def test_the_embedded_instance_trains_one_stage_at_a_time_and_evaluates_two(embedded):
    assert embedded.get_concurrency_config().pool_config.default_pool_limit == 1  # from the dagster.yaml dagster_home wrote
    assert apply_pool_limits(embedded, POOL_LIMITS) == {TRAINING_POOL: 1, EVALUATION_POOL: 2}
    assert embedded.event_log_storage.get_concurrency_info(TRAINING_POOL).slot_count == 1


def test_a_pool_a_run_met_before_its_limit_was_set_gets_its_own(embedded):
    embedded.event_log_storage.initialize_concurrency_limit_to_default(EVALUATION_POOL)  # what `factory run` does first
    assert embedded.event_log_storage.get_concurrency_info(EVALUATION_POOL).slot_count == 1
    assert apply_pool_limits(embedded, POOL_LIMITS)[EVALUATION_POOL] == 2


def test_a_limit_set_on_the_instance_stays_unless_the_environment_sets_one(embedded):
    embedded.event_log_storage.set_concurrency_slots(TRAINING_POOL, 4)  # `dagster instance concurrency set training 4`
    assert apply_pool_limits(embedded, *pool_limits({}))[TRAINING_POOL] == 4
    assert apply_pool_limits(embedded, *pool_limits({"FACTORY_POOL_TRAINING": "2"})) == {TRAINING_POOL: 2, EVALUATION_POOL: 2}
    with pytest.raises(ConfigError, match="FACTORY_POOL_EVALUATION"):
        pool_limits({"FACTORY_POOL_EVALUATION": "two"})


def test_a_cluster_profile_says_how_many_train_at_once(embedded, tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text("queues: {default: {nodes: 4}}\npools: {training: 4}\n")
    assert apply_pool_limits(embedded, *pool_limits({}, load_profile(path))) == {TRAINING_POOL: 4, EVALUATION_POOL: 2}
    assert apply_pool_limits(embedded, *pool_limits({"FACTORY_POOL_TRAINING": "3"}, load_profile(path)))[TRAINING_POOL] == 3
    path.write_text("queues: {default: {nodes: 4}}\npools:\n  gpu: 2\n")
    with pytest.raises(ConfigError, match="profile.yaml:2: pools: unknown pool gpu"):
        load_profile(path)


@asset(pool=TRAINING_POOL)
def first() -> int:
    return 1


@asset(pool=TRAINING_POOL)
def second(first: int) -> int:
    return first + 1


def test_an_in_process_run_waits_for_a_slot_another_run_holds_and_never_on_itself(embedded):
    apply_pool_limits(embedded, POOL_LIMITS)
    assert materialize([first, second], instance=embedded).success  # two training steps, one slot: one after the other
    storage = embedded.event_log_storage
    assert storage.claim_concurrency_slot(TRAINING_POOL, "another-run", "pretrain").is_claimed
    done = []
    thread = threading.Thread(target=lambda: done.append(materialize([first], instance=embedded)), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not (reasons := blocked(embedded)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert reasons == [f"Step blocked by limit for pool {TRAINING_POOL}"]  # what the run's page shows on the step
        assert not done, "the run took a slot the other run holds"
    finally:
        storage.free_concurrency_slots_for_run("another-run")
    thread.join(timeout=180)  # a blocked step checks again every 15 s at most; under the whole suite's load a run takes long
    assert done and done[0].success, "the run never went on once the other run's slot was freed"


@op(pool=TRAINING_POOL)
def trains() -> int:
    return 1


@job(executor_def=multiprocess_executor)
def waits_for_the_training_slot():
    """What a run the daemon or the UI launches executes with: Dagster's multiprocess executor (a process per step)."""
    trains()


@pytest.mark.parametrize("executor", ["in-process", "multiprocess"])
def test_a_run_waits_for_a_slot_asleep(embedded, executor):
    """`factory run`'s runs (in-process) and the daemon's and the UI's (multiprocess): while its only step waits for a slot
    another run holds, the run's process sleeps between its checks (Dagster's loops would ask again at once, a core spinning
    for as long as the other run trains)."""
    apply_pool_limits(embedded, POOL_LIMITS)
    storage = embedded.event_log_storage
    assert storage.claim_concurrency_slot(TRAINING_POOL, "another-run", "pretrain").is_claimed
    done = []
    run = {"in-process": lambda: materialize([first], instance=embedded),
           "multiprocess": lambda: execute_job(reconstructable(waits_for_the_training_slot), embedded)}[executor]
    thread = threading.Thread(target=lambda: done.append(run()), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not blocked(embedded) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert blocked(embedded) and not done, "the step waits for the slot the other run holds"
        started = time.process_time()  # this process's CPU, all its threads: the run's loop is the only one working now
        time.sleep(2)
        assert time.process_time() - started < 0.5, "two seconds of waiting, asleep: a loop asking again at once burns them"
    finally:
        storage.free_concurrency_slots_for_run("another-run")
    thread.join(timeout=180)
    assert done and done[0].success, "the run never went on once the other run's slot was freed"


def blocked(instance: DagsterInstance) -> list[str]:
    """The messages of the steps waiting for a pool's slot, as the event log holds them."""
    records = instance.get_event_records(EventRecordsFilter(DagsterEventType.ENGINE_EVENT))
    return [r.event_log_entry.message for r in records if "blocked by limit for pool" in (r.event_log_entry.message or "")]


def test_the_repositorys_settings_file_sets_the_pools_under_the_environment(embedded, tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()
    (tmp_path / "factory.toml").write_text("[pools]\ntraining = 3\n")
    monkeypatch.chdir(tmp_path)
    profile = tmp_path / "profile.yaml"
    profile.write_text("queues: {default: {nodes: 4}}\npools: {training: 4, evaluation: 8}\n")
    assert apply_pool_limits(embedded, *pool_limits({}, load_profile(profile))) == {TRAINING_POOL: 3, EVALUATION_POOL: 8}
    assert apply_pool_limits(embedded, *pool_limits({"FACTORY_POOL_TRAINING": "5"}))[TRAINING_POOL] == 5
