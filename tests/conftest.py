"""Shared fixtures: the one tiny experiment the docs and the tests share; evaluation results as the evaluator publishes them.

Also how the suite runs in parallel (`make test`: pytest-xdist, one worker more than the cores): a module's tests stay on one
worker and the tiny pipeline's readers share one (`pytest_xdist_make_scheduler`); every module gets a PostgreSQL
database of its own; and under several workers each test process computes on one thread, since the workers already
fill the cores (torch's thread pools would otherwise wait on one another, spinning), and compiles in itself (inductor
would start a pool of compile workers, each importing torch, in every process that compiles). The sqlite databases a test process
opens (the Dagster instances of in-process runs above all) commit without waiting for the disk.
"""

import hashlib
import json
import os
import sqlite3
import tempfile
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from factory.registry import ArtifactStore

pytest_plugins = ["tests.timing", "tests.room"]  # the suite's wall time and its ten slowest modules, printed at the end of every
# run; the room it needs on disk, checked before it starts
REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "experiments" / "tiny-code-lm.md"
if os.environ.get("PYTEST_XDIST_WORKER"):  # before torch is imported here, and inherited by every process a test starts
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"):
        os.environ.setdefault(variable, "1")


@event.listens_for(Engine, "connect")
def _sqlite_without_fsync(connection, _record) -> None:
    """The tests' sqlite databases (Dagster's runs and events, the catalogs, MLflow's store) in this process do not wait for
    the disk at each commit: the tests' PostgreSQL server runs with fsync=off for the same reason."""
    if isinstance(connection, sqlite3.Connection):
        connection.execute("PRAGMA synchronous=OFF")


@pytest.fixture(scope="session", autouse=True)
def data_roots_with_temp():
    """Directory sources read only under the data roots (default: the repository); the tests' sources live in temporary
    directories, so those are data roots too (set in os.environ: the processes a test starts inherit it). The home
    directory is not one, as by default."""
    from factory.config.files import DATA_ROOTS_ENV

    if DATA_ROOTS_ENV not in os.environ:
        os.environ[DATA_ROOTS_ENV] = os.pathsep.join([str(REPO), tempfile.gettempdir()])
    yield


@pytest.fixture(scope="session", autouse=True)
def torchrun_logs(tmp_path_factory):
    """The files torchrun keeps of its ranks' output, for the launches the tests make themselves: in the session's
    temporary directory, not a directory of torch's own in /tmp that nothing removes (a stage's launcher gives each stage
    its own, `RANK_LOGS_ENV`)."""
    from factory.launch.local import RANK_LOGS_ENV

    if RANK_LOGS_ENV not in os.environ:
        os.environ[RANK_LOGS_ENV] = str(tmp_path_factory.mktemp("torchrun-logs"))
    yield


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    """The experiment file `make run` uses."""
    return TINY


def training_settings(kind: str = "pretrain", model: dict | None = None, shuffle_buffer_docs: int = 1024) -> dict:
    """The settings a training stage of `kind` records (defaults but for `model` and the stream's buffer), as plain JSON."""
    from factory.config.kinds import stage_kind
    from factory.config.schema import Experiment, ModelConfig, StreamSettings, TrainedModel

    experiment = Experiment.model_validate({"name": "t", "pretrain": {"steps": 10}, "sft": {"steps": 10}, "rl": {"steps": 4}})
    settings = stage_kind(kind).fingerprint(experiment)
    stream = StreamSettings(shuffle_buffer_docs=shuffle_buffer_docs, packing="best-fit", pack_window_docs=64)
    assert isinstance(settings, TrainedModel)
    return settings.model_copy(update={"model": ModelConfig.model_validate(model or {}), "stream": stream}).model_dump(mode="json")


def publish_result(registry: ArtifactStore, experiment: str, benchmark: str, value: float, step: int = 100, training: str = "run-1",
                   count: int = 64, stage: str = "pretrain", blend: str = "b" * 64, content: str = "content-0", primary: str | None = None) -> None:
    """A score of `experiment`'s checkpoint at `step` (from its training run `training`, on a blend of digest `blend`, its file
    ranking by `primary`), published as the evaluator does; a benchmark of a pinned table reads it as holding `content`."""
    from factory.evals.benchmarks import benchmark as registered
    from factory.evals.scored_on import table_ref
    from factory.stages.evaluation import CheckpointRef, EvalItem
    from factory.stages.scoring import publish_score, scored_on

    spec = {"kind": stage, "config": training_settings(stage), "upstream": {"blend": blend}, "code": training}
    checkpoint = CheckpointRef(key=f"{experiment}__{stage}-{step:06d}", experiment=experiment, step=step, tokens_seen=10 * step,
                               path="unused", sha256=f"{experiment}{step}{training}".ljust(64, "0"), training=spec,
                               eval={"max_bytes": 1000, "batch_size": 8, "primary": primary}, git_commit="0" * 40)
    item = EvalItem(partition=f"{benchmark}|{checkpoint.key}", benchmark=benchmark, checkpoint=checkpoint)
    bench = registered(benchmark)
    publish_score(registry, item, bench, value, count, {}, 0.1, scored_on(bench, checkpoint, content if table_ref(bench.data) else ""),
                  code="local:test")


def publish_model(registry: ArtifactStore, experiment: str, step: int = 100, training: str = "run-1", stage: str = "pretrain",
                  blend: str = "b" * 64) -> str:
    """The training stage whose checkpoints `publish_result` scores (same arguments), published as a finished run ending at
    `step`, and the model a model stage exported from it: the model's digest."""
    from factory.config.stages import StageSpec
    from factory.registry.store import Provenance

    spec = StageSpec.from_json({"kind": stage, "config": training_settings(stage), "upstream": {"blend": blend}, "code": training})
    provenance = Provenance(experiment=experiment, config_hash="0" * 16, git_commit="0" * 40)
    trained = registry.lookup(spec.fingerprint)
    if trained is None:
        with registry.staging() as out:
            (out / "run.json").write_text(json.dumps({"fingerprint": spec.fingerprint}))
            trained = registry.publish(out, kind=stage, fingerprint=spec.fingerprint, config=spec.config, inputs=spec.upstream, code=training,
                                       provenance=provenance, summary={"steps": step})
    if (model := registry.lookup(f"model-{spec.fingerprint}")) is None:
        with registry.staging() as out:
            (out / "model.pt").write_text(f"{experiment}{training}")
            model = registry.publish(out, kind="model", fingerprint=f"model-{spec.fingerprint}", config={}, inputs={stage: trained.digest},
                                     code=training, provenance=provenance, summary={})
    return model.digest


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL server (Debian's package) for this test process; its URL."""
    from tests.postgres import running_postgres

    with running_postgres() as url:
        yield url


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 server (moto's, tests/s3server.py) for this test process, with one empty bucket; `kill` and `restart`
    take its endpoint away and back (the objects stay). A test that kills it restarts it before it ends."""
    from tests.s3server import running_s3

    with running_s3() as server:
        yield server


@pytest.fixture(scope="module")
def postgres(postgres_server, request):
    """A database of its own on the server, for one test module: no module sees another's catalog or Dagster storage."""
    from tests.postgres import fresh_database

    return fresh_database(postgres_server, "t_" + hashlib.sha256(request.module.__name__.encode()).hexdigest()[:16])


# The modules whose tests read the shared tiny pipeline (tests/e2e/conftest.py): one worker runs them all, so the
# pipeline is built once and no other worker waits for it. A test elsewhere that asks for it fails at collection.
TINY_PIPELINE_READERS = ("tests/e2e/test_tiny_experiment.py", "tests/e2e/test_ui.py", "tests/e2e/test_llama.py")
SPREAD = ("tests/bench/test_smoke.py",)
"""Modules of independent processes and no module fixture: each test is a unit of its own, so the workers share them."""
HEAVY = ("e2e", "slow")  # modules that take a minute or more: scheduled first, so none is left to run alone at the end


def pytest_xdist_make_scheduler(config, log):
    """`make test`'s scheduling (pytest-xdist, `--dist loadscope`): a module's tests go to one worker, whole (its module
    fixtures are built once) but SPREAD's, the tiny pipeline's readers together, and the modules in collection order (below)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            if module in SPREAD:
                return nodeid
            return "tiny-pipeline" if module in TINY_PIPELINE_READERS else module

    if config.getvalue("dist") == "loadscope":
        config.option.loadscopereorder = False
        return ByModule(config, log)
    return None


def pytest_collection_modifyitems(items):
    """The heavy modules first, the tiny pipeline's readers (the longest unit of work: the pipeline and three modules)
    before them, each kept in the random order pytest-randomly gave (it shuffles before this runs)."""
    for item in items:
        module = item.nodeid.split("::")[0]
        if "pipeline" in getattr(item, "fixturenames", ()) and module not in TINY_PIPELINE_READERS:
            raise pytest.UsageError(f"{module} reads the shared tiny pipeline: add it to TINY_PIPELINE_READERS in tests/conftest.py")
    def order(item) -> tuple[bool, bool]:
        return not any(item.get_closest_marker(name) for name in HEAVY), item.nodeid.split("::")[0] not in TINY_PIPELINE_READERS

    items.sort(key=order)
