"""The warm interpreter: a stage forked from it is a process of its own, and it refuses what a cold start would do otherwise."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import psutil
import pytest

from factory.launch.warm import SHARED_SOCKET_ENV, WarmProcess, WarmServer

REPO = Path(__file__).resolve().parents[2]
CHILD = "tests.launch.warm_child"
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the warm interpreter forks: Linux only")


def imported(warm: WarmServer) -> dict:
    """The server's status once its imports are done (or stopped at a failure)."""
    for _ in range(600):
        status = warm.status()
        if status is None or status["problem"] or status["imported"] == status["modules"]:
            return status
        time.sleep(0.05)
    raise AssertionError(f"the warm server never finished its imports: {status}")


@pytest.fixture
def server(monkeypatch):
    monkeypatch.chdir(REPO)
    warm = WarmServer(["email.mime.text"])
    assert imported(warm)["problem"] is None
    yield warm
    warm.close()


def test_a_forked_child_has_its_own_pid_arguments_directory_environment_output_and_exit_code(server, tmp_path, capfd):
    out = tmp_path / "seen.json"
    env = {**server.env, "WARM_MARKER": "launch-1", "WARM_EXIT": "3"}
    child = server.spawn([sys.executable, "-m", CHILD, str(out)], env, ["WARM_MARKER", "WARM_EXIT"])
    assert child is not None, server.refused
    stderr = child.stderr.read()
    assert child.wait(timeout=30) == 3
    seen = json.loads(out.read_text())
    assert seen["pid"] == child.pid and child.pid not in (os.getpid(), server._process.pid)
    assert seen == {**seen, "argv": [str(out)], "cwd": str(REPO), "marker": "launch-1", "preloaded": True, "name": "__main__"}
    assert stderr == b"said on stderr\n"
    assert "said on stdout" in capfd.readouterr().out


def test_a_forked_child_keeps_its_temporary_files_where_its_launch_says_as_a_cold_start_does(tmp_path, monkeypatch):
    """The server asked for the temporary directory as it imported (torch's import does): a launch that names another
    (TMPDIR, as the launcher sets it for a stage) gets that one, not the server's."""
    monkeypatch.chdir(REPO)
    warm = WarmServer(["tests.launch.asks_tempdir"])
    try:
        assert imported(warm)["problem"] is None
        out, launched = tmp_path / "seen.json", tmp_path / "launch-tmp"
        launched.mkdir()
        child = warm.spawn([sys.executable, "-m", CHILD, str(out)], {**warm.env, "TMPDIR": str(launched)}, ["TMPDIR"])
        assert child is not None, warm.refused
        assert child.wait(timeout=30) == 0
        assert json.loads(out.read_text())["tempdir"] == str(launched)
    finally:
        warm.close()


def test_a_launch_gets_the_modules_it_needs_imported_before_its_fork(tmp_path, monkeypatch):
    """The server imports in order, between launches; a launch that arrives early waits for what it names, not the rest."""
    monkeypatch.chdir(REPO)
    gate = tmp_path / "gate"
    monkeypatch.setenv("WARM_GATE", str(gate))
    warm = WarmServer(["tests.launch.gated_import", "xml.dom.minidom", "email.mime.text"])
    try:
        threading.Timer(0.5, gate.touch).start()  # the launch below is sent while the first import waits
        out = tmp_path / "seen.json"
        child = warm.spawn([sys.executable, "-m", CHILD, str(out)], warm.env, [], needs=["email.mime.text"])
        assert child is not None, warm.refused
        assert child.wait(timeout=60) == 0
        assert json.loads(out.read_text())["preloaded"]
        status = warm.status()
        assert status["problem"] is None and status["imported"] >= 2
    finally:
        warm.close()


def status_once(warm: WarmServer, ready, what: str) -> dict:
    """The server's status once `ready(status)` holds."""
    for _ in range(600):
        if ready(status := warm.status()):
            return status
        time.sleep(0.05)
    raise AssertionError(f"the warm server never had {what}: {status}")


def test_the_imports_wait_for_a_launch_while_no_stage_runs_and_go_on_while_one_does(tmp_path, monkeypatch):
    """An import cannot be interrupted: one begun just before a launch (torch's takes a second or two) would hold that stage
    up. Once the modules the first stage needs are imported, and after a stage ends, the others wait for a launch (here as
    long as the test runs: FACTORY_WARM_HOLD_S); while a stage runs, they go on."""
    monkeypatch.chdir(REPO)
    gate, later = tmp_path / "gate", tmp_path / "later"
    monkeypatch.setenv("WARM_GATE", str(gate))
    monkeypatch.setenv("WARM_GATE_LATER", str(later))
    monkeypatch.setenv("FACTORY_WARM_HOLD_S", "600")
    warm = WarmServer(["email.mime.text", "tests.launch.gated_import", "tests.launch.gated_later"], first=1)
    timers = [threading.Timer(120, path.touch) for path in (gate, later)]  # a server that went on importing would hold a launch until then
    for timer in timers:
        timer.daemon = True
        timer.start()
    try:
        status_once(warm, lambda status: status["imported"] >= 1, "the first stage's module")
        first = launched(warm, tmp_path / "first.json")
        assert "tests.launch.gated_import" not in first.seen["modules"], "the first launch waited for an import it does not need"
        assert warm.status(timeout=1) is None, "while the stage runs, the server imports the next module (held at its gate)"
        first.process.kill()
        gone(first.process.pid)  # before the gate opens: the server, importing, sees it end only after
        gate.touch()
        assert first.process.wait(timeout=30) == -signal.SIGKILL
        time.sleep(1)  # time for a server that did not hold to begin the next import, which waits at its gate
        status = warm.status(timeout=5)
        assert status is not None and status["imported"] == 2, f"after a stage ends, the imports wait for the next launch: {status}"
        second = launched(warm, tmp_path / "second.json")
        assert "tests.launch.gated_later" not in second.seen["modules"]
        later.touch()
        status_once(warm, lambda status: status["imported"] == 3, "the last module, imported while the second stage runs")
        assert second.process.poll() is None
        second.process.kill()
        assert second.process.wait(timeout=30) == -signal.SIGKILL
    finally:
        for timer in timers:
            timer.cancel()
        gate.touch()
        later.touch()
        warm.close()


def gone(pid: int) -> None:
    """Wait until process `pid` has ended (a zombie its parent has not reaped yet, or reaped)."""
    for _ in range(600):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} did not end")


class Launched(NamedTuple):
    process: WarmProcess
    seen: dict


def launched(warm: WarmServer, out: Path) -> Launched:
    """A child of `warm` (tests.launch.warm_child, for a minute) once it has said what it sees."""
    child = warm.spawn([sys.executable, "-m", CHILD, str(out), "60"], warm.env, [])
    assert child is not None, warm.refused
    for _ in range(600):
        if out.exists() and out.stat().st_size:
            return Launched(child, json.loads(out.read_text()))
        time.sleep(0.05)
    raise AssertionError(f"the child never wrote {out}")


@pytest.mark.parametrize("ending", ["sys.exit", "exit_now"])
def test_a_childs_exit_code_reaches_its_launcher_while_the_server_is_importing(ending, tmp_path, monkeypatch):
    """The server reports an exit between two imports only; the child tells its own code as it ends, however it ends (a
    stage ends with `exit_now`)."""
    monkeypatch.chdir(REPO)
    gate = tmp_path / "gate"
    monkeypatch.setenv("WARM_GATE", str(gate))
    monkeypatch.setenv("FACTORY_WARM_HOLD_S", "600")  # the gated import begins with the child, not before its launch
    warm = WarmServer(["email.mime.text", "tests.launch.gated_import"], first=1)
    try:
        status_once(warm, lambda status: status["imported"] >= 1, "the first stage's modules")
        env = {**warm.env, "WARM_EXIT": "259", "WARM_ENDING": ending}  # an exit status is the code modulo 256
        # it lives a second, while the server begins the import that then holds it (the gate stays shut)
        child = warm.spawn([sys.executable, "-m", CHILD, str(tmp_path / "seen.json"), "1"], env, ["WARM_EXIT", "WARM_ENDING"])
        assert child is not None, warm.refused
        assert child.wait(timeout=30) == 3  # the gate stays shut: the server is importing all along
        assert warm.status(timeout=0.5) is None, "the server answered, so it was not importing"
    finally:
        gate.touch()
        warm.close()


def test_a_killed_child_reports_its_signal_and_the_server_goes_on(server, tmp_path):
    child = server.spawn([sys.executable, "-m", CHILD, str(tmp_path / "a.json"), "60"], server.env, [])
    assert child is not None, server.refused
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    child.kill()
    assert child.wait(timeout=30) == -signal.SIGKILL
    again = server.spawn([sys.executable, "-m", CHILD, str(tmp_path / "b.json")], server.env, [])
    assert again is not None and again.wait(timeout=30) == 0


OWNER = """
import sys, time
from factory.launch.warm import WarmServer
warm = WarmServer(["email.mime.text"])
print(warm.socket_path, warm._process.pid, flush=True)
time.sleep(600)
"""
"""A process that starts a server and holds it until it is killed."""


def test_a_server_whose_launcher_was_killed_ends_and_leaves_no_socket_behind(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", OWNER], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        socket_path, pid = owner.stdout.readline().split()
        server = psutil.Process(int(pid))
        for _ in range(600):  # bound before it is killed: the server has made its socket
            if Path(socket_path).exists():
                break
            time.sleep(0.05)
        assert Path(socket_path).exists()
    finally:
        owner.kill()
        owner.wait()
    server.wait(timeout=60)
    assert not Path(socket_path).parent.exists()


def test_a_server_stopped_by_sigterm_ends_so_and_leaves_no_socket_behind():
    warm = WarmServer(["email.mime.text"])
    try:
        assert imported(warm)["problem"] is None
        warm._process.send_signal(signal.SIGTERM)  # as a process group stopped with `factory ui` in it gets
        assert warm._process.wait(timeout=60) == -signal.SIGTERM
        assert not warm.socket_path.parent.exists()
    finally:
        warm.close()


LAUNCH = """
import sys
from factory.launch import LocalLauncher
LocalLauncher().run([sys.executable, "-m", "tests.launch.warm_child", sys.argv[1]], {"WARM_MARKER": "shared"}, "child")
"""
"""A process that launches one stage as a Dagster step process does (`factory ui`'s daemon started it, not us)."""


def test_the_processes_under_factory_ui_fork_their_stages_from_its_warm_interpreter_while_it_runs(server, tmp_path):
    """A launcher that finds the shared server's socket in its environment forks from it, though Dagster's own variables
    differ from the server's; once the server is gone, it starts its stage cold, at once."""
    env = {**server.env, SHARED_SOCKET_ENV: str(server.socket_path), "DAGSTER_RUN_JOB_NAME": "a step's"}
    launcher = subprocess.run([sys.executable, "-c", LAUNCH, str(tmp_path / "warm.json")], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=60)
    assert launcher.returncode == 0 and "start cold" not in launcher.stderr, launcher.stderr
    seen = json.loads((tmp_path / "warm.json").read_text())
    assert seen["parent"] == server._process.pid and seen["preloaded"] and seen["marker"] == "shared"
    server.close()
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCH, str(tmp_path / "cold.json")], env=env, cwd=REPO)
    assert launcher.wait(timeout=60) == 0
    seen = json.loads((tmp_path / "cold.json").read_text())
    assert seen["parent"] == launcher.pid and not seen["preloaded"] and seen["marker"] == "shared"


def test_an_environment_that_differs_beyond_the_launch_variables_is_refused(server, tmp_path):
    env = {**server.env, "OMP_NUM_THREADS": "7"}
    assert server.spawn([sys.executable, "-m", CHILD, str(tmp_path / "a.json")], env, ["WARM_MARKER"]) is None
    assert "OMP_NUM_THREADS" in server.refused
    assert not (tmp_path / "a.json").exists()


def test_source_changed_since_the_imports_is_refused(tmp_path, monkeypatch):
    package = tmp_path / "warmpkg"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 1\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{REPO}")
    warm = WarmServer(["warmpkg"])
    try:
        argv = [sys.executable, "-m", CHILD, str(tmp_path / "a.json")]
        first = warm.spawn(argv, warm.env, [])
        assert first is not None and first.wait(timeout=30) == 0, warm.refused
        (package / "__init__.py").write_text("VALUE = 2  # edited while the server holds the old code\n")
        assert warm.spawn(argv, warm.env, []) is None
        assert "warmpkg/__init__.py changed" in warm.refused
    finally:
        warm.close()


def test_a_module_that_does_not_import_makes_every_launch_cold(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    warm = WarmServer(["no_such_module_here"])
    try:
        assert "no_such_module_here did not import" in imported(warm)["problem"]
        assert warm.spawn([sys.executable, "-m", CHILD, str(tmp_path / "a.json")], warm.env, []) is None
        assert "no_such_module_here did not import" in warm.refused
    finally:
        warm.close()


def test_what_the_imports_set_in_the_environment_the_child_has_too(tmp_path, monkeypatch):
    package = tmp_path / "setsenv"
    package.mkdir()
    (package / "__init__.py").write_text("import os\nos.environ['WARM_MARKER'] = 'set at import'\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{REPO}")
    monkeypatch.chdir(REPO)
    warm = WarmServer(["setsenv"])
    try:
        assert imported(warm)["problem"] is None
        child = warm.spawn([sys.executable, "-m", CHILD, str(tmp_path / "seen.json")], warm.env, [])
        assert child is not None and child.wait(timeout=30) == 0, warm.refused
        assert json.loads((tmp_path / "seen.json").read_text())["marker"] == "set at import"  # as a cold start importing it would
    finally:
        warm.close()


def test_a_captured_run_forks_when_it_can_and_says_the_same_as_a_cold_one(tmp_path, monkeypatch, capfd):
    """`run_captured` (what `factory reproduce` runs each stage with): in a directory of its choosing, stdout dropped, stderr
    and exit code returned; forked inside `warm_starts`, cold when the server refuses (an environment it does not have)."""
    from factory.launch.local import run_captured, warm_starts

    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("WARM_EXIT", "3")
    work = tmp_path / "work"
    work.mkdir()
    with warm_starts(["email.mime.text"]) as warm:
        assert imported(warm)["problem"] is None
        env = {**os.environ, "WARM_MARKER": "warm"}
        said = run_captured([sys.executable, "-m", CHILD, str(tmp_path / "warm.json")], env, work, ["WARM_MARKER"], ["email.mime.text"])
        cold = run_captured([sys.executable, "-m", CHILD, str(tmp_path / "cold.json")], env, work)  # WARM_MARKER is not a launch key
    assert said == cold == (3, "said on stderr\n")
    assert "said on stdout" not in capfd.readouterr().out
    warm_seen, cold_seen = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("warm", "cold"))
    assert warm_seen["preloaded"] and not cold_seen["preloaded"]
    assert warm_seen["cwd"] == cold_seen["cwd"] == str(work) and warm_seen["marker"] == cold_seen["marker"] == "warm"


def test_the_next_block_in_the_same_environment_forks_from_the_same_interpreter_until_the_code_or_environment_changes(tmp_path, monkeypatch):
    """A process that runs one experiment after another (a script, a notebook, the test suite) imports once: the
    next `warm_starts` block serves from the previous block's interpreter, and from a new one when the environment
    differs (but for pytest's name of the test under way), a source file it imported changed since, or packages were
    installed. A block that asks for modules it was not started with is served by the same one, which imports them in
    the background."""
    from factory.launch.local import run_captured, warm_starts

    package = tmp_path / "warmpkg"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 1\n")
    installed = tmp_path / "site-packages"  # a directory of installed packages on the path, as the venv's is
    installed.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(map(str, [tmp_path, installed, REPO])))

    def served(name: str, modules: tuple[str, ...] = ("warmpkg", "email.mime.text")) -> int:
        """The pid of the interpreter a child forked from in a new block (its parent)."""
        with warm_starts(modules) as warm:
            child = warm.spawn([sys.executable, "-m", CHILD, str(tmp_path / f"{name}.json")], warm.env, [], needs=list(modules))
            assert child is not None and child.wait(timeout=60) == 0, warm.refused
        seen = json.loads((tmp_path / f"{name}.json").read_text())
        assert seen["preloaded"]
        return seen["parent"]

    first = served("first")
    assert served("again") == first
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/elsewhere.py::test_next (call)")  # pytest's, as the next test begins
    with warm_starts(("warmpkg", "email.mime.text")):
        said = run_captured([sys.executable, "-m", CHILD, str(tmp_path / "next-test.json")], dict(os.environ), tmp_path)
    next_test = json.loads((tmp_path / "next-test.json").read_text())
    assert said == (0, "said on stderr\n") and next_test["parent"] == first
    assert next_test["current_test"] == "tests/elsewhere.py::test_next (call)"  # the launch's, as a cold start's
    monkeypatch.setenv("WARM_MARKER", "another environment")
    other = served("other")
    assert other != first and psutil.pid_exists(other)
    assert not psutil.pid_exists(first)  # replaced: closed
    (package / "__init__.py").write_text("VALUE = 2  # edited between two runs\n")
    edited = served("edited")
    assert edited not in (first, other)
    (installed / "newpkg").mkdir()  # a package installed between two runs
    reinstalled = served("reinstalled")
    assert reinstalled != edited and served("again") == reinstalled
    with warm_starts(("warmpkg", "email.mime.text", "colorsys")) as warm:  # a module nothing here imports
        deadline = time.monotonic() + 60
        while (status := warm.status(timeout=5)) is not None and status["imported"] < status["modules"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status == {**(status or {}), "imported": 3, "modules": 3}
        child = warm.spawn([sys.executable, "-m", CHILD, str(tmp_path / "more.json")], warm.env, [])  # needs nothing
        assert child is not None and child.wait(timeout=60) == 0, warm.refused
    more = json.loads((tmp_path / "more.json").read_text())
    assert more["parent"] == reinstalled and "colorsys" in more["modules"]
    # A package asked for later is watched from then on; one imported already (by an earlier module) must be unchanged
    # since the interpreter started, where it was not watched.
    for name, text in {"warmlater": "", "warmdep": "", "warmtop": "import warmdep\n"}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(text)
    assert served("later", ("warmpkg", "email.mime.text", "warmlater")) == reinstalled
    (tmp_path / "warmlater" / "__init__.py").write_text("VALUE = 2  # edited after it was preloaded\n")
    later = served("edited-later", ("email.mime.text", "warmtop"))
    assert later != reinstalled
    assert served("top", ("email.mime.text", "warmtop")) == later
    (tmp_path / "warmdep" / "__init__.py").write_text("VALUE = 2  # edited after warmtop's import brought it in\n")
    assert served("dep", ("email.mime.text", "warmtop", "warmdep")) != later


def test_a_launch_checks_the_projects_source_files_and_leaves_installed_packages_to_their_directory():
    """Before each fork the server checks that the code it imported is the code on disk: the project's files one by one,
    the installed packages (torch's 2,300 files among them) by the mtime of their directory, which an install changes."""
    from factory.launch.warm_server import _installed_stamps, _source_stamps

    stamps = _source_stamps(["factory.config", "torch._dynamo", "sqlalchemy.dialects.sqlite"])
    assert str(REPO / "factory" / "config" / "__init__.py") in stamps and str(REPO / "factory" / "launch" / "warm.py") in stamps
    assert [path for path in stamps if not path.startswith(str(REPO)) or "site-packages" in Path(path).parts] == []
    assert [path for path in _installed_stamps() if Path(path).name == "site-packages"]
