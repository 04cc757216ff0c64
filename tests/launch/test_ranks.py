"""`factory.runtime.ranks`: torchrun whose ranks fork from it. Forked from a warm interpreter, its ranks start with what
that imported and see what torchrun's own ranks see; failures, signals and stops end them as torchrun's end."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from factory.launch.local import FAILED_RANK, RANKS_MODULE, RANKS_NEEDS, TORCHRUN
from factory.launch.warm import WarmServer

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="the warm interpreter forks: Linux only")]
REPO = Path(__file__).resolve().parents[2]
PROBE = "tests.launch.rank_probe"
OPTIONS = ["--standalone", "--nproc_per_node=2", "--tee", "2"]
CHANGING = ("pid", "preloaded", "random")
"""What differs between any two launches, or between a fresh and a forked rank."""


def probe_env() -> dict[str, str]:
    """Ours, with the repository on the path and no OMP_NUM_THREADS (torchrun sets it for its ranks)."""
    return {name: value for name, value in os.environ.items() if name != "OMP_NUM_THREADS"} | {"PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def warm():
    server = WarmServer(["torch", *RANKS_NEEDS], probe_env())
    yield server
    server.close()


def torchrun(out: Path, mode: str, warm: WarmServer | None = None):
    """The probe on two ranks: under torchrun (cold), or forked from `warm` under this module; the process."""
    out.mkdir(exist_ok=True)
    if warm is None:
        return subprocess.Popen([sys.executable, "-m", TORCHRUN, *OPTIONS, "-m", PROBE, str(out), mode], env=probe_env(), cwd=REPO,
                                stderr=subprocess.PIPE)
    forked = warm.spawn([sys.executable, "-m", RANKS_MODULE, *OPTIONS, "-m", PROBE, str(out), mode], warm.env, ["PYTEST_CURRENT_TEST"],
                        needs=RANKS_NEEDS, cwd=REPO)
    assert forked is not None, warm.refused
    return forked


def ended(process) -> tuple[int, str]:
    err = process.stderr.read().decode()
    return process.wait(timeout=120), err


def seen(out: Path) -> list[dict]:
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(2)]


def test_forked_ranks_see_what_torchruns_ranks_see_with_torch_imported_already(tmp_path, warm):
    cold_code, cold_err = ended(torchrun(tmp_path / "cold", "ok"))
    forked_code, forked_err = ended(torchrun(tmp_path / "forked", "ok", warm))
    assert cold_code == forked_code == 0, (cold_err[-2000:], forked_err[-2000:])
    cold, forked = seen(tmp_path / "cold"), seen(tmp_path / "forked")
    strip = lambda found, out: [{k: str(v).replace(str(out), "OUT") for k, v in r.items() if k not in CHANGING} for r in found]  # noqa: E731
    assert strip(forked, tmp_path / "forked") == strip(cold, tmp_path / "cold")  # ranks, world, `__main__`, argv, threads
    assert [r["preloaded"] for r in cold] == [False, False] and [r["preloaded"] for r in forked] == [True, True]
    assert forked[0]["random"] != forked[1]["random"]  # each rank seeds `random` afresh, as a fresh interpreter does
    for err in (cold_err, forked_err):
        assert "[default0]:rank 0 says hello" in err and "[default1]:rank 1 says hello" in err  # --tee 2's prefixes


@pytest.mark.parametrize(("mode", "code"), [("fail", "3"), ("kill", "-9")])
def test_a_rank_that_fails_or_is_killed_fails_the_launch_as_under_torchrun(tmp_path, warm, mode, code):
    for out, process in (("cold", torchrun(tmp_path / "cold", mode)), ("forked", torchrun(tmp_path / "forked", mode, warm))):
        status, err = ended(process)
        assert status == 1, (out, err[-2000:])
        assert f"exitcode: {code}" in err and FAILED_RANK.search(err).group(1) == "1", (out, err[-3000:])


@pytest.mark.parametrize("victim", ["launch", "agent", "waiter"])
def test_a_stopped_launch_stops_its_ranks_and_a_killed_one_leaves_none_running(tmp_path, warm, victim):
    out = tmp_path / victim
    process = torchrun(out, "wait", warm)
    deadline = time.monotonic() + 60
    while not all((out / f"rank-{rank}.json").exists() for rank in range(2)):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    time.sleep(0.2)  # the files are written whole: json.loads below
    ranks = [psutil.Process(r["pid"]) for r in seen(out)]
    try:
        if victim == "launch":
            os.kill(process.pid, signal.SIGTERM)  # as the local launcher stops a stage
        elif victim == "agent":
            os.kill(process.pid, signal.SIGKILL)  # torchrun's own ranks would outlive it
        else:
            ranks[1].parent().kill()  # what the agent started, which waits for the rank
        gone, alive = psutil.wait_procs(ranks, timeout=60)
        assert not alive, alive
        assert process.wait(timeout=60) != 0
        if victim != "waiter":  # each rank was asked to stop (and could unwind), not killed
            assert [(out / f"stopped-{rank}").exists() for rank in range(2)] == [True, True]
    finally:
        process.stderr.close()
        for left in ranks:  # a failure above leaves none behind
            if left.is_running():
                left.kill()
