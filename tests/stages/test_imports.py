"""Nothing heavy is imported before it is needed: checking or planning a file loads no torch, and a data stage (or a
warm interpreter for a run of data stages only) loads no torch either. Read from `python -X importtime`, which lists
every module a process imports."""

import ast
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from factory.config.plugins import resolve
from factory.data.catalog import OPENED_MODULES
from factory.runtime import every_warm_module, warm_modules
from factory.stages.builtin import BUILTIN_KINDS
from factory.stages.pretrain import PRETRAIN

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "kubernetes", "matplotlib", "dagster", "mlflow", "pyiceberg")
NOT_FOR_CHECKING = ("kubernetes_validate", "jsonschema", "dagster_pipes")
"""What only a Volcano launch (its manifests' schema) or a stage process (Pipes) needs."""


def imported(*args: str) -> set[str]:
    """The top-level packages a Python process with these arguments imports."""
    done = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line.split("|")[-1] for line in done.stderr.splitlines() if line.startswith("import time:")]
    return {line.strip().split(".")[0] for line in lines[1:]}


@pytest.mark.parametrize("command", ["check", "plan"])
def test_checking_or_planning_a_file_loads_nothing_heavy(command, tiny_path, tmp_path):
    root = ["--root", str(tmp_path)] if command == "plan" else []
    assert imported("-m", "factory", command, str(tiny_path), *root).isdisjoint(HEAVY + NOT_FOR_CHECKING)


def test_a_data_stage_loads_no_torch_and_a_training_stage_does():
    data = warm_modules(["raw_datasets", "deduped_datasets", "filtered_datasets", "blend"], "mlflow")
    assert data[:6] == ("factory.runtime.__main__", *OPENED_MODULES, "factory.stages.datasets", "factory.stages.versions")
    assert "factory.stages.blend" in data and "factory.data.dedup" in data
    assert not any(m.startswith(("factory.track.", "factory.evals.", "factory.stages.evaluate")) for m in data), "nothing trains"
    code = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
    loaded = imported("-c", code, *data)
    assert "pyiceberg" in loaded and "torch" not in loaded
    training = warm_modules(["tokenizer", "pretrain", "model"], "none")
    assert "factory.stages.scoring" in training and not any(m.startswith("factory.track.") for m in training)
    assert "torch" in imported("-c", code, *training)
    assert "torch" in imported("-c", code, *PRETRAIN.imports), "the kind's module is light; what its run function imports is not"
    assert set(warm_modules(["pretrain"], "mlflow")) < set(every_warm_module())


@pytest.mark.parametrize("kind", BUILTIN_KINDS, ids=lambda k: k.name)
def test_a_warm_interpreter_imports_ahead_what_a_built_in_run_function_imports(kind):
    """A kind's module stays light by importing its code inside its run function; its `imports` name that code, so a
    warm interpreter loads it once. The library's config is left out: reading the registry loads it already."""
    functions = [kind.run_function(), *([resolve(kind.training.batches)] if kind.training is not None else [])]  # a training kind's source
    trees = [ast.parse(inspect.getsource(function).lstrip()) for function in functions]
    inside = {node.module for tree in trees for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)} | {
        alias.name for tree in trees for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert inside, "a built-in run function imports its code when it runs"
    assert {m for m in inside if not m.startswith("factory.config.")} <= set(kind.imports)


def test_a_warm_interpreter_for_a_training_run_imports_what_building_an_optimizer_imports():
    """torch imports its compiler's front end (dynamo) when a process builds its first optimizer: a warm interpreter for a
    run that trains imports it ahead, or each training stage it forks would import it again."""
    code = ("import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]; before = set(sys.modules); import torch; "
            "torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))]); print(sorted(set(sys.modules) - before))")
    done = subprocess.run([sys.executable, "-c", code, *warm_modules(["pretrain"], "none")], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", f"building an optimizer imported what the warm interpreter had not: {done.stdout[:500]}"


def test_a_warm_interpreter_imports_what_opening_the_catalog_and_writing_a_table_imports(tmp_path):
    """A data stage forked from a warm interpreter imports nothing more to open the catalog and write a table (pyiceberg's
    SQL catalog and its SQLAlchemy, its pyarrow IO: imported lazily by the library, ahead by the warm interpreter)."""
    code = ("import importlib, sys; [importlib.import_module(m) for m in sys.argv[2:]]; before = set(sys.modules); "
            "import pyarrow as pa; from pathlib import Path; from factory.data.catalog import CatalogConfig, open_catalog; "
            "catalog = open_catalog(CatalogConfig.local(Path(sys.argv[1]))); catalog.create_namespace('raw'); "
            "table = catalog.create_table('raw.t', pa.schema([('id', pa.string())])); table.append(pa.table({'id': ['a']})); "
            "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in ('pyiceberg', 'sqlalchemy', 'pyarrow')))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path), *warm_modules(["raw_datasets"], "none")], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", f"opening the catalog imported what the warm interpreter had not: {done.stdout[:500]}"


def modules_of(args: list[str]) -> set[str]:
    """Every module a Python process with these arguments imports, by its full name."""
    done = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


SAVE_AND_LOAD = """
import logging, sys, torch
from pathlib import Path
from factory.train.checkpoint import CheckpointDir, RetentionPolicy, load_checkpoint
store = CheckpointDir(Path(sys.argv[1]), RetentionPolicy(), logging.getLogger("t"), sharded=sys.argv[2] == "sharded")
store.save(1, {"w": torch.ones(3)}, {"loss": 1.0})
[saved] = store.complete()
assert torch.equal(load_checkpoint(saved.path, saved.sha256)["w"], torch.ones(3))
"""


def test_a_single_file_checkpoint_is_saved_and_loaded_without_importing_torch_distributed_checkpoint(tmp_path):
    """torch.distributed.checkpoint (and DTensor with it) takes 1.6 s to import beside torch's 3: an evaluation or a model
    stage reading a single-file checkpoint does without it; a sharded one needs it."""
    assert "torch.distributed.checkpoint" not in modules_of(["-c", SAVE_AND_LOAD, str(tmp_path / "file"), "file"])
    assert "torch.distributed.checkpoint" in modules_of(["-c", SAVE_AND_LOAD, str(tmp_path / "sharded"), "sharded"])


def test_a_data_stage_on_this_machine_runs_daft_natively_without_importing_ray(tmp_path):
    """Daft picking a runner itself imports Ray to see whether it runs in a Ray job: half a second of every data stage.
    The process ends as a stage process does (`exit_now`, no finalisation): Daft 0.7's native threads can crash an
    interpreter that finalises right after a query (a segfault in one run of about 15 on a loaded machine)."""
    code = ("import logging, sys; from factory.data.engine import use_engine; import daft; "
            "said = use_engine(logging.getLogger('t'), {}); "
            "assert daft.from_pydict({'a': [1, 2]}).sum('a').to_pydict() == {'a': [3]}; "
            "print(said, '|', 'ray' in sys.modules, '|', daft.runners.get_or_infer_runner_type()); "
            "from factory.launch.ending import exit_now; exit_now(0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env={**os.environ, "FACTORY_RAY_ADDRESS": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    said, ray, runner = (part.strip() for part in done.stdout.split("|"))
    assert said.startswith("Daft's native runner") and runner == "native"
    assert ray == "False", "Ray imported by a stage that runs on this machine"


def test_a_daft_runner_the_user_names_is_left_to_daft():
    """`$DAFT_RUNNER` set: the stage does not set the runner itself, so Daft takes the one named (a runner set already
    could not be set again: Daft refuses a second)."""
    code = ("import logging; from factory.data.engine import use_engine; import daft; "
            "use_engine(logging.getLogger('t'), {}); daft.set_runner_native(); print('unset until now'); "
            "from factory.launch.ending import exit_now; exit_now(0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "FACTORY_RAY_ADDRESS": "", "DAFT_RUNNER": "native"})
    assert done.returncode == 0 and "unset until now" in done.stdout, done.stderr[-2000:]


def test_the_stage_module_reads_the_registered_kinds_as_it_is_imported_so_a_warm_interpreter_holds_them():
    """Reading the kinds (every installed package's entry points, each plugin imported) is a tenth of a second that each
    stage forked from a warm interpreter would otherwise spend again: the interpreter imports the stage module first."""
    code = "import factory.runtime.__main__, factory.config.kinds as kinds; print(kinds.registered_kinds.cache_info().currsize)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "1"
    assert "factory.runtime.__main__" in warm_modules(["raw_datasets"], "none")
