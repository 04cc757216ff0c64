"""The local launcher on real child processes: environment, exit codes, stderr tail, start failures."""

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from factory.errors import LaunchError, StageFailed
from factory.launch.local import ERROR_FILE_ENV, STDERR_TAIL_LINES, LocalLauncher, stage_argv

REPO = Path(__file__).resolve().parents[2]


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def test_env_vars_reach_the_child_on_top_of_ours(tmp_path, monkeypatch):
    monkeypatch.setenv("FACTORY_TEST_INHERITED", "from-parent")
    out = tmp_path / "env.txt"
    env = "os.environ['FACTORY_STAGE_X'] + ',' + os.environ['FACTORY_TEST_INHERITED']"
    code = f"import os, sys; open(sys.argv[1], 'w').write({env})"
    LocalLauncher().run(python(code, str(out)), {"FACTORY_STAGE_X": "given"}, name="env")
    assert out.read_text() == "given,from-parent"


def test_given_env_overrides_the_parent_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FACTORY_TEST_VALUE", "parent")
    out = tmp_path / "env.txt"
    code = "import os, sys; open(sys.argv[1], 'w').write(os.environ['FACTORY_TEST_VALUE'])"
    LocalLauncher().run(python(code, str(out)), {"FACTORY_TEST_VALUE": "child"}, name="override")
    assert out.read_text() == "child"


def test_stderr_is_streamed_through(capfd):
    LocalLauncher().run(python("import sys; sys.stderr.write('progress 1\\nprogress 2\\n')"), {}, name="chatty")
    assert "progress 1\nprogress 2\n" in capfd.readouterr().err


def test_non_zero_exit_raises_with_the_code_and_the_last_stderr_lines():
    code = "import sys\nfor i in range(30): print(f'line {i}', file=sys.stderr)\nsys.exit(3)"
    with pytest.raises(StageFailed) as failed:
        LocalLauncher().run(python(code), {}, name="broken")
    message = str(failed.value)
    assert "'broken'" in message
    assert "code 3" in message
    assert "line 29" in message
    assert f"line {30 - STDERR_TAIL_LINES}\n" in message
    assert f"line {30 - STDERR_TAIL_LINES - 1}\n" not in message


def test_a_silent_failure_says_there_was_no_stderr():
    with pytest.raises(StageFailed, match=r"code 7:\n\(no output on stderr\)"):
        LocalLauncher().run(python("raise SystemExit(7)"), {}, name="silent")


def test_a_missing_executable_is_a_launch_error(tmp_path):
    missing = str(tmp_path / "no-such-python")
    with pytest.raises(LaunchError, match="no-such-python") as failed:
        LocalLauncher().run([missing, "-c", "pass"], {}, name="ghost")
    assert isinstance(failed.value.__cause__, OSError)
    assert not isinstance(failed.value, StageFailed)


def test_stage_argv_runs_the_stages_module_on_the_request():
    request = Path("/tmp/requests/corpus.json")
    assert stage_argv(request) == [sys.executable, "-m", "factory.runtime", "/tmp/requests/corpus.json"]
    assert stage_argv(request, python="/opt/py/bin/python3")[0] == "/opt/py/bin/python3"


def test_several_nodes_are_refused_with_what_to_change():
    with pytest.raises(LaunchError, match="resources.nodes is 2, but the local launcher runs a stage on this one machine"):
        stage_argv(Path("/tmp/r.json"), processes=2, nodes=2)


RANK_FAILS = """\
import os, sys, time
rank = int(os.environ["RANK"])
print(f"[rank {rank}] working", file=sys.stderr, flush=True)
if rank == 1:
    print("[rank 1] about to fail", file=sys.stderr, flush=True)
    raise ValueError("boom on rank 1")
time.sleep(60)
"""


def test_a_failing_rank_is_named_with_its_own_last_lines_and_its_logs_go_with_the_stage(tmp_path):
    """torchrun keeps its ranks' output in files: in the stage's scratch directory, not a temporary directory of its own
    that outlives the stage (one per launch piled up in /tmp)."""
    script, temporary = tmp_path / "ranks.py", tmp_path / "tmp"
    script.write_text(RANK_FAILS)
    temporary.mkdir()
    argv = stage_argv(tmp_path / "request.json", processes=2)
    assert argv[argv.index("--tee") + 1] == "2"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--tee", "2", str(script)]
    with pytest.raises(StageFailed) as failed:
        LocalLauncher().run(torchrun, {"TMPDIR": str(temporary)}, name="ranks")
    message = str(failed.value)
    assert "rank 1 failed first, its last lines:" in message
    assert "[rank 1] about to fail" in message and "ValueError: boom on rank 1" in message
    assert "[rank 0] working" not in message and "Root Cause" not in message
    assert list(temporary.iterdir()) == []


def test_a_stage_hears_whether_its_stderr_ends_on_a_terminal(tmp_path, monkeypatch):
    import os
    import pty

    out = tmp_path / "progress.txt"
    code = "import os, sys; open(sys.argv[1], 'w').write(os.environ['FACTORY_PROGRESS'])"
    monkeypatch.delenv("FACTORY_PROGRESS", raising=False)
    LocalLauncher().run(python(code, str(out)), {}, name="captured")
    assert out.read_text() == "0"  # pytest captures stderr: not a terminal
    leader, follower = pty.openpty()
    with open(follower, "w", closefd=True) as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        LocalLauncher().run(python(code, str(out)), {}, name="terminal")
    os.close(leader)
    assert out.read_text() == "1"


def test_redrawn_lines_reach_the_terminal_and_the_tail_keeps_what_was_left_on_screen(capfd):
    code = "import sys\nfor i in range(3): sys.stderr.write(f'\\rstep {i}/3'); sys.stderr.flush()\nsys.stderr.write('\\ndone\\n'); sys.exit(4)"
    with pytest.raises(StageFailed) as failed:
        LocalLauncher().run(python(code), {}, name="bar")
    assert "\rstep 0/3\rstep 1/3\rstep 2/3\ndone" in capfd.readouterr().err
    assert str(failed.value).endswith("code 4:\nstep 2/3\ndone")


STOPPING_STAGE = f"""
import os, pathlib, signal, sys, time
ERROR_FILE_ENV = {ERROR_FILE_ENV!r}  # where the launcher asks a stage for its one line
marks = pathlib.Path(sys.argv[1])
def stop(*_):
    with open(os.environ[ERROR_FILE_ENV], "w") as f:
        f.write("pretrain: interrupted at step 7 of 100; its last checkpoint is step_000005.pt")
    (marks / "stopping").touch()
    time.sleep(30)  # still unwinding (a checkpoint being saved, say) when the second interrupt comes
    (marks / "unwound").touch()
    sys.exit(130)
signal.signal(signal.SIGTERM, stop)
(marks / "ready").touch()
time.sleep(60)
"""
INTERRUPTED_TWICE = """
import json, os, pathlib, signal, sys, threading, time
from factory.launch.local import LocalLauncher
marks, stage = pathlib.Path(sys.argv[1]), sys.argv[2]
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as Python sets it, whatever this process inherited
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # (a shell ignores SIGINT for `cmd &`; a pytest worker may)

def when(mark):
    deadline = time.monotonic() + 120
    while not (marks / mark).exists():
        if time.monotonic() > deadline:
            os._exit(3)
        time.sleep(0.02)

def interrupt_twice():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # the interrupts are the main thread's, as Ctrl-C's are
    when("ready")
    os.kill(os.getpid(), signal.SIGINT)
    when("stopping")  # the launcher asked the stage to stop, and it is unwinding
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt_twice, daemon=True).start()
try:
    LocalLauncher().run([sys.executable, "-c", stage, str(marks)], {}, name="pretrain")
except KeyboardInterrupt as e:
    print(json.dumps({"notes": getattr(e, "__notes__", []), "stopping": (marks / "stopping").exists(), "unwound": (marks / "unwound").exists()}))
"""


def test_a_second_interrupt_while_the_stage_stops_kills_it_and_the_first_still_says_where_it_stopped(tmp_path):
    """Ctrl-C twice (or a termination asked twice): the first asks the stage to stop in order, the second, arriving while
    it does, kills it at once; the stage is gone either way, and the interruption carries what the stage said. In a
    process of its own, whose signals are its own."""
    done = subprocess.run(python(INTERRUPTED_TWICE, str(tmp_path), STOPPING_STAGE), capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-3000:]
    said = json.loads(done.stdout)
    assert said["stopping"] and not said["unwound"]  # killed as it unwound
    assert said["notes"] == ["pretrain: pretrain: interrupted at step 7 of 100; its last checkpoint is step_000005.pt"]
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]  # none left running
