"""TrackingConfig.from_env, flatten, the null run and the guards every run shares."""

import subprocess
import sys
from pathlib import Path

import pytest

from factory.errors import ConfigError
from factory.track.base import NullRun, TrackingConfig, flatten, open_run


def test_from_env_defaults_to_mlflow_on_the_local_store():
    config = TrackingConfig.from_env({})

    assert config == TrackingConfig(backend="mlflow", uri=None, project=None, experiment="model-factory")


def test_from_env_reads_each_variable():
    config = TrackingConfig.from_env(
        {"FACTORY_TRACKER": "neptune", "FACTORY_TRACKER_URI": "http://mlflow:5000", "FACTORY_TRACKER_PROJECT": "ml/lm"}
    )

    assert (config.backend, config.uri, config.project) == ("neptune", "http://mlflow:5000", "ml/lm")


def test_from_env_accepts_none_in_any_case_and_treats_empty_as_unset():
    assert TrackingConfig.from_env({"FACTORY_TRACKER": " None "}).backend == "none"
    assert TrackingConfig.from_env({"FACTORY_TRACKER": "", "FACTORY_TRACKER_URI": ""}) == TrackingConfig()


def test_from_env_rejects_an_unknown_backend_naming_the_variable_and_the_choices():
    with pytest.raises(ConfigError) as caught:
        TrackingConfig.from_env({"FACTORY_TRACKER": "wandb"})

    message = str(caught.value)
    assert "FACTORY_TRACKER='wandb'" in message
    assert "mlflow, neptune, none" in message


def test_neptune_needs_a_workspace_slash_project():
    with pytest.raises(ConfigError, match="FACTORY_TRACKER_PROJECT=workspace/project"):
        TrackingConfig.from_env({"FACTORY_TRACKER": "neptune"})
    with pytest.raises(ConfigError, match="write it as workspace/project"):
        TrackingConfig(backend="neptune", project="just-a-name")


def test_config_is_frozen():
    config = TrackingConfig()

    with pytest.raises(AttributeError):
        config.backend = "none"  # type: ignore[misc]


def test_flatten_joins_nested_keys_with_dots_and_keeps_scalars():
    flat = flatten({"model": {"n_layer": 4, "attn": {"heads": 2}}, "lr": 3e-4, "tied": True, "name": "gpt"})

    assert flat == {"model.n_layer": 4, "model.attn.heads": 2, "lr": 3e-4, "tied": True, "name": "gpt"}


def test_flatten_stringifies_other_values():
    flat = flatten({"betas": (0.9, 0.95), "stages": ["pretrain"], "seed": None, "path": Path("/data")})

    assert flat == {"betas": "(0.9, 0.95)", "stages": "['pretrain']", "seed": "None", "path": "/data"}


def test_flatten_refuses_two_settings_that_collide():
    with pytest.raises(ValueError, match="model.n_layer"):
        flatten({"model.n_layer": 1, "model": {"n_layer": 2}})


def test_backend_none_gives_a_null_run(tmp_path):
    run = open_run(TrackingConfig(backend="none"), tmp_path, name="pretrain", run_key="abc")
    run.log_params({"a": {"b": 1}})
    run.log_metrics(0, {"loss": 1.0})
    run.set_tags({"stage": "pretrain"})
    run.finish("finished")

    assert isinstance(run, NullRun)
    assert (run.id, run.url) == ("", "")
    assert list(tmp_path.iterdir()) == []


def test_run_guards_steps_status_and_use_after_finish():
    run = NullRun()

    with pytest.raises(ValueError, match="non-negative int"):
        run.log_metrics(-1, {"loss": 1.0})
    with pytest.raises(ValueError, match="non-negative int"):
        run.log_metrics(1.5, {"loss": 1.0})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="status"):
        run.finish("done")  # type: ignore[arg-type]
    run.finish("failed")
    run.finish("finished")  # a second finish is a no-op
    with pytest.raises(RuntimeError, match="already finished"):
        run.log_metrics(1, {"loss": 1.0})


def test_run_key_must_be_safe_for_every_backend(tmp_path):
    with pytest.raises(ValueError, match="run_key"):
        open_run(TrackingConfig(backend="none"), tmp_path, name="x", run_key="exp/pretrain")


def test_importing_factory_track_imports_no_tracking_library():
    code = "import sys, factory.track; print(sorted(m for m in sys.modules if m.startswith(('mlflow', 'neptune'))))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert result.stdout.strip() == "[]"
