"""Every bench under bench/ runs at a tiny size (`--smoke`) and prints its ratio lines, so that none stops working while
nothing else runs it (bench/overhead.py did, unnoticed, when the held-out benchmark joined the tiny recipe).

Each bench runs as `make bench` runs it, a script in a process of its own, forked from one that imported the libraries
the benches import (`tests/forked.py`): seventeen benches would otherwise pay two or three seconds of imports each.
Its figures are not checked: at a smoke size, on a loaded machine, they measure nothing worth comparing.
"""

import os
import re
from pathlib import Path

import pytest

from tests.forked import ForkServer

REPO = Path(__file__).resolve().parents[2]
BENCHES = sorted(path.name for path in (REPO / "bench").glob("*.py") if 'if __name__ == "__main__":' in path.read_text())
"""The scripts; bench/ also holds modules they import (bench/smoke.py, bench/weight_benchmark.py)."""
THROUGH_DAGSTER = ("overhead.py", "stage_cache.py", "eval_backfill.py")
"""Benches that run experiments or evaluations through Dagster: end to end, left out of `make test-fast` as the other
whole-pipeline runs are."""
RATIO = re.compile(r"\bratio\b.*\d|\S / \S.*= *[-+]?\d|\d(\.\d+)?x\b")
"""A line that states a ratio: `ratio ...: 1.2x`, `loader / trainer = 24.5x`, or a figure in x."""
SMOKE_TIMEOUT_S = 600
pytestmark = pytest.mark.slow  # about two CPU-minutes in all, one bench after another: scheduled first
WARM = ("numpy", "torch", "dagster", "factory.config")
"""What every bench imports, or most, imported before any fork: none starts a thread on import, and none reads a setting
a bench sets before importing it (transformers' HF_HUB_OFFLINE, for one, is left to the benches; pyarrow, whose
allocator starts a thread, too)."""


@pytest.fixture(scope="module")
def warm():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}  # a smoke size gains nothing from more threads
    server = ForkServer(WARM, env)
    yield server
    server.stop()


@pytest.fixture
def smoke(warm, tmp_path):
    """`python bench/NAME --smoke OPTIONS` (through `warm`), on one thread."""
    return lambda name, *options: warm.run(["--smoke", *options], script=REPO / "bench" / name, timeout_s=SMOKE_TIMEOUT_S, directory=tmp_path)


def ratio_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if RATIO.search(line)]


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.e2e) if name in THROUGH_DAGSTER else name for name in BENCHES])
def test_a_bench_runs_at_its_smoke_size_and_prints_its_ratios(name, smoke):
    done = smoke(name)
    assert done.returncode == 0, f"bench/{name} --smoke exited {done.returncode}:\n{done.stderr[-4000:]}"
    assert ratio_lines(done.stdout), f"bench/{name} --smoke printed no ratio:\n{done.stdout[-4000:]}"


def test_the_gpu_bench_runs_on_two_gpus_and_refuses_cleanly_with_fewer(smoke):
    import torch

    done = smoke("fsdp.py", "--device", "cuda")
    if torch.cuda.device_count() >= 2:
        assert done.returncode == 0, done.stderr[-4000:]
        assert ratio_lines(done.stdout), done.stdout[-4000:]
    else:
        assert done.returncode == 1, done.stderr[-4000:]
        assert "--device cuda needs a GPU per rank (2), this machine has" in done.stderr
        assert "Traceback" not in done.stderr


def test_make_bench_runs_every_bench():
    recipe = re.search(r"^bench:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert recipe, "the Makefile has a bench target"
    assert sorted(re.findall(r"bench/(\w+\.py)", recipe.group(1))) == BENCHES


def test_a_ratio_line_is_told_from_other_output():
    assert ratio_lines("ratio compute / reuse: 5.1x\nheadroom: loader / trainer = 24.5x (goal >= 10x)\nfsdp: FSDP / DDP = 0.530 median")
    assert not ratio_lines("check 20 files: 0.02 s (0.98 ms per file)\nrun report of tiny-smoke: /tmp/x/report.html")
