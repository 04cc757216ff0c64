"""The trainer of tests/train as processes: `launch` starts `python -m tests.train.trainer` (its ranks under torchrun), forked
from a warm interpreter when the test has one (`warm`)."""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from factory.launch.local import TORCHRUN, forking
from factory.launch.warm import WarmProcess, WarmServer
from factory.runtime import OPTIMIZER_MODULES

REPO = Path(__file__).resolve().parents[2]
TRAINER = "tests.train.trainer"
"""The training run, as a module: `python -m tests.train.trainer ...`."""
TRAINER_ENV = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
"""What every trainer's environment sets (a warm interpreter's too, as its children's must equal it)."""
LAUNCH_KEYS = ("CONTROL", "FORMAT", "ASYNC", "PARALLELISM", "EXTRA", "PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR")
"""The variables a launch sets for its own run, the one pytest sets for each test (which it started in), and the one
inductor sets in the test process at its first compile there (its default cache directory, which a trainer would choose
itself): a launch refused for any of them starts cold, seconds of imports a rank."""


@pytest.fixture(scope="module")
def warm() -> Iterator[WarmServer]:
    """A warm interpreter that imported the trainer's code once (`factory.launch.warm`, what `factory run` forks its stages
    from): a trainer, or the torchrun that starts its ranks, forked from it is a process of its own, killed alone, without
    seconds of imports first (torchrun still starts each rank as a fresh interpreter)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in TRAINER_ENV.items():
            patch.setenv(name, value)
        server = WarmServer([TRAINER, *OPTIMIZER_MODULES])
    yield server
    server.close()


def launch(
    work: Path, steps: int = 60, every: int = 10, accum: int = 1, ranks: int = 1, dropout: float = 0.1, control: str = "",
    sharded: bool = False, asynchronous: bool = False, parallelism: str = "ddp", extra: dict | None = None,
    warm: WarmServer | None = None,
) -> subprocess.Popen | WarmProcess:
    """The trainer as a process (several under torchrun); dropout on by default, so RNG state matters. `control`: a
    control section as JSON; `parallelism: fsdp` implies sharded checkpoints; `extra`: more pretrain fields. With `warm`, the
    process forks from that warm interpreter (one it refuses starts cold)."""
    prefix = [sys.executable] if ranks == 1 else [sys.executable, "-m", TORCHRUN, "--standalone", f"--nproc_per_node={ranks}"]
    argv = [*prefix, "-m", TRAINER, str(work), str(steps), str(every), str(accum), str(dropout)]
    own = {"CONTROL": control, "FORMAT": "sharded" if sharded or parallelism == "fsdp" else "file", "ASYNC": "1" if asynchronous else "0",
           "PARALLELISM": parallelism, "EXTRA": json.dumps(extra or {})}
    env = {**os.environ, **TRAINER_ENV, **own}
    if warm is not None:  # several ranks: torchrun whose ranks fork from it, as a stage's do
        forked_argv, needs = forking(argv, [TRAINER])
        if (forked := warm.spawn(forked_argv, env, LAUNCH_KEYS, needs=needs)) is not None:
            return forked
    return subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)


def ended(process: subprocess.Popen | WarmProcess) -> tuple[int, str]:
    """Wait for the trainer to end: its exit code and what it said on stderr."""
    if isinstance(process, WarmProcess):
        with process.stderr:
            err = process.stderr.read().decode()
        return process.wait(timeout=300), err
    _, err = process.communicate(timeout=300)
    return process.returncode, err


def finish(process: subprocess.Popen | WarmProcess) -> str:
    """Wait for the trainer to end, which it must do well; what it said on stderr."""
    code, err = ended(process)
    assert code == 0, err[-3000:]
    return err
