"""The MLflow tracker on a real sqlite store, read back through MlflowClient."""

import contextlib
import shutil
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.tracking import MlflowClient

from factory.errors import ConfigError
from factory.track.base import TrackingConfig, open_run
from factory.track.mlflow_backend import RUN_KEY_TAG, run_url, store_location

CONFIG = TrackingConfig()


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """A new, migrated MLflow store, made once: creating one runs all of MLflow's migrations (seconds)."""
    root = tmp_path_factory.mktemp("empty")
    uri, _ = store_location(CONFIG, root)
    MlflowClient(tracking_uri=uri).search_experiments()
    return root / "mlflow" / "mlflow.db"


@pytest.fixture
def root(tmp_path, empty_store) -> Path:
    """A factory root whose MLflow store exists but holds no runs yet."""
    (tmp_path / "mlflow").mkdir()
    shutil.copyfile(empty_store, tmp_path / "mlflow" / "mlflow.db")
    return tmp_path


@pytest.fixture
def client(root) -> MlflowClient:
    """A second client on the same store, as the MLflow UI would read it."""
    uri, _ = store_location(CONFIG, root)
    return MlflowClient(tracking_uri=uri)


def test_params_metrics_and_tags_are_logged_and_read_back(root, client):
    run = open_run(CONFIG, root, name="tiny/pretrain", run_key="fp-1")
    run.log_params({"model": {"n_layer": 2, "d_model": 64}, "lr": 0.001, "betas": [0.9, 0.95]})
    for step, loss in [(0, 4.0), (10, 3.0), (20, 2.5)]:
        run.log_metrics(step, {"train/loss": loss, "train/lr": 1e-3})
    run.set_tags({"stage": "pretrain", "experiment": "tiny"})
    run.finish("finished")

    stored = client.get_run(run.id)
    history = sorted(client.get_metric_history(run.id, "train/loss"), key=lambda m: m.step)
    assert stored.data.params == {"model.n_layer": "2", "model.d_model": "64", "lr": "0.001", "betas": "[0.9, 0.95]"}
    assert [(m.step, m.value) for m in history] == [(0, 4.0), (10, 3.0), (20, 2.5)]
    assert stored.data.tags["stage"] == "pretrain"
    assert stored.data.tags[RUN_KEY_TAG] == "fp-1"
    assert stored.info.run_name == "tiny/pretrain"
    assert stored.info.status == "FINISHED"
    assert stored.info.end_time is not None


def test_the_store_and_artifacts_live_under_the_root(root, client):
    run = open_run(CONFIG, root, name="n", run_key="fp-1")

    experiment = client.get_experiment_by_name("model-factory")
    assert (root / "mlflow" / "mlflow.db").is_file()
    assert experiment.artifact_location == (root / "mlflow" / "artifacts").resolve().as_uri()
    assert run.url == f"mlflow run {run.id} in sqlite:///{(root / 'mlflow' / 'mlflow.db').resolve()}"


def test_a_failed_run_is_marked_failed(root, client):
    run = open_run(CONFIG, root, name="n", run_key="fp-1")
    run.finish("failed")

    assert client.get_run(run.id).info.status == "FAILED"


def test_reopening_an_unfinished_key_resumes_the_same_run(root, client):
    first = open_run(CONFIG, root, name="n", run_key="fp-1")
    first.log_params({"lr": 0.1})
    first.log_metrics(1, {"loss": 2.0})
    # the process dies here: no finish()

    second = open_run(CONFIG, root, name="n", run_key="fp-1")
    assert client.get_run(second.id).info.status == "RUNNING"
    second.log_params({"lr": 0.1})  # a relaunched stage logs its (unchanged) params again
    second.log_metrics(2, {"loss": 1.0})
    second.finish("finished")

    assert second.id == first.id
    assert [m.step for m in client.get_metric_history(second.id, "loss")] == [1, 2]
    assert len(client.search_runs([client.get_experiment_by_name("model-factory").experiment_id])) == 1


def test_a_failed_run_is_resumed_by_its_relaunch(root, client):
    first = open_run(CONFIG, root, name="n", run_key="fp-1")
    first.finish("failed")

    second = open_run(CONFIG, root, name="n", run_key="fp-1")

    assert second.id == first.id
    assert client.get_run(second.id).info.status == "RUNNING"


def test_a_finished_run_is_not_resumed(root, client):
    first = open_run(CONFIG, root, name="n", run_key="fp-1")
    first.finish("finished")

    second = open_run(CONFIG, root, name="n", run_key="fp-1")

    assert second.id != first.id
    assert client.get_run(first.id).info.status == "FINISHED"
    assert client.get_run(second.id).info.status == "RUNNING"


def test_two_runs_in_one_process_do_not_interfere(root, client):
    a = open_run(CONFIG, root, name="a", run_key="fp-a")
    b = open_run(CONFIG, root, name="b", run_key="fp-b")
    a.log_metrics(0, {"loss": 1.0})
    b.log_metrics(0, {"loss": 9.0})
    b.finish("failed")
    a.finish("finished")

    assert a.id != b.id
    assert [m.value for m in client.get_metric_history(a.id, "loss")] == [1.0]
    assert (client.get_run(a.id).info.status, client.get_run(b.id).info.status) == ("FINISHED", "FAILED")


def test_creating_the_store_prints_no_mlflow_chatter(tmp_path, capfd):
    open_run(CONFIG, tmp_path, name="n", run_key="fp-1").finish("finished")

    out, err = capfd.readouterr()
    assert "database tables" not in out + err
    assert "alembic" not in out + err


def test_an_unusable_tracking_uri_is_a_config_error(tmp_path):
    config = TrackingConfig(uri="nosuchscheme://somewhere")

    with pytest.raises(ConfigError, match="FACTORY_TRACKER_URI"):
        open_run(config, tmp_path, name="n", run_key="fp-1")


def test_a_server_that_does_not_answer_is_a_config_error_at_once(tmp_path):
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = TrackingConfig(uri=f"http://127.0.0.1:{port}")

    with pytest.raises(ConfigError, match=f"no MLflow server answers at http://127.0.0.1:{port}"):
        open_run(config, tmp_path, name="n", run_key="fp-1")


def test_server_runs_link_to_the_ui():
    url = run_url("http://mlflow:5000/", experiment_id="3", run_id="ab12")

    assert url == "http://mlflow:5000/#/experiments/3/runs/ab12"



def test_the_sqlite_store_is_imported_with_the_backend_not_when_a_stage_opens_it(tmp_path):
    """A warm interpreter imports the backend's module once for all the training stages it forks: the sqlite store's code
    (its SQLAlchemy models, seconds of imports) must come with it, not be imported again by each stage opening its run."""
    code = (
        "import sys; from pathlib import Path\n"
        "from factory.track.base import TrackingConfig, open_run\n"
        "import factory.track.mlflow_backend\n"
        "before = set(sys.modules)\n"
        "open_run(TrackingConfig(), Path(sys.argv[1]), name='probe', run_key='probe').finish('finished')\n"
        "print(' '.join(sorted(set(sys.modules) - before)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "mlflow.store.tracking.sqlalchemy_store" not in done.stdout.split()
    assert (tmp_path / "mlflow" / "mlflow.db").is_file()


def test_with_an_object_store_new_experiments_keep_their_artifacts_in_it(root, client, monkeypatch):
    monkeypatch.setenv("FACTORY_STORE", "s3://team-bucket/factory/")
    run = open_run(CONFIG, root, name="tiny/pretrain", run_key="fp-store")
    run.finish("finished")
    [experiment] = [e for e in client.search_experiments() if e.name == CONFIG.experiment]
    assert experiment.artifact_location == "s3://team-bucket/factory/mlflow"
    monkeypatch.delenv("FACTORY_STORE")
    assert store_location(CONFIG, root)[1] == (root / "mlflow" / "artifacts").resolve().as_uri()


def schema(path: Path) -> tuple:
    """A sqlite store's tables and indexes (each definition's lines in order: MLflow's migrations write a table's checks in
    either order from one run to the next) and its alembic revision."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall()
        revision = db.execute("SELECT version_num FROM alembic_version").fetchall()
    return sorted((kind, name, sorted((sql or "").split(", \n"))) for kind, name, sql in rows), revision


def test_a_new_store_is_a_copy_of_the_one_mlflow_makes_kept_once_for_its_version(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    open_run(CONFIG, tmp_path / "a", name="n", run_key="fp-1").finish("finished")
    [template] = (tmp_path / "cache" / "model-factory").glob("mlflow-*.db")
    theirs = tmp_path / "theirs.db"
    SqlAlchemyStore(f"sqlite:///{theirs}", (tmp_path / "artifacts").as_uri())  # the store MLflow makes on its own
    assert schema(tmp_path / "a" / "mlflow" / "mlflow.db") == schema(theirs) == schema(template)
    client = MlflowClient(tracking_uri=store_location(CONFIG, tmp_path / "a")[0])
    assert "cache" not in client.get_experiment_by_name("Default").artifact_location, "MLflow adds Default as it opens the copy"

    with contextlib.closing(sqlite3.connect(template)) as db:  # the next new store is copied from the kept one
        db.execute("CREATE TABLE seen_in_the_copy (x)")
        db.commit()
    open_run(CONFIG, tmp_path / "b", name="n", run_key="fp-1").finish("finished")
    assert "seen_in_the_copy" in {name for _, name, _ in schema(tmp_path / "b" / "mlflow" / "mlflow.db")[0]}


def test_without_a_cache_directory_mlflow_makes_the_store_itself(tmp_path, monkeypatch):
    (tmp_path / "not-a-directory").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-directory"))
    run = open_run(CONFIG, tmp_path / "root", name="n", run_key="fp-1")
    run.log_metrics(1, {"loss": 1.0})
    run.finish("finished")
    client = MlflowClient(tracking_uri=store_location(CONFIG, tmp_path / "root")[0])
    assert [m.value for m in client.get_metric_history(run.id, "loss")] == [1.0]
