"""Nothing heavy is imported before it is needed: checking or planning a file loads no torch, and a data stage (or a
warm interpreter for a run of data stages only) loads no torch either. Read from `python -X importtime`, which lists
every module a process imports."""

import subprocess
import sys
from pathlib import Path

import pytest

from factory.runtime import every_warm_module, warm_modules

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "kubernetes", "matplotlib", "dagster", "mlflow", "pyiceberg")


def imported(*args: str) -> set[str]:
    """The top-level packages a Python process with these arguments imports."""
    done = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line.split("|")[-1] for line in done.stderr.splitlines() if line.startswith("import time:")]
    return {line.strip().split(".")[0] for line in lines[1:]}


@pytest.mark.parametrize("command", ["check", "plan"])
def test_checking_or_planning_a_file_loads_nothing_heavy(command, tiny_path, tmp_path):
    root = ["--root", str(tmp_path)] if command == "plan" else []
    assert imported("-m", "factory", command, str(tiny_path), *root).isdisjoint(HEAVY)


def test_a_data_stage_loads_no_torch_and_a_training_stage_does():
    data = warm_modules(["raw_datasets", "deduped_datasets", "filtered_datasets", "blend"], "mlflow")
    assert data == ("factory.runtime.__main__", "factory.stages.datasets"), "no tracker, no evaluations: nothing trains"
    code = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
    loaded = imported("-c", code, *data)
    assert "pyiceberg" in loaded and "torch" not in loaded
    training = warm_modules(["tokenizer", "pretrain", "model"], "none")
    assert "factory.stages.scoring" in training and not any(m.startswith("factory.track.") for m in training)
    assert "torch" in imported("-c", code, *training)
    assert set(warm_modules(["pretrain"], "mlflow")) < set(every_warm_module())
