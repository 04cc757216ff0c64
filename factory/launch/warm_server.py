"""The warm interpreter's server: imports the stages' modules once, then forks a child per launch (see `factory.launch.warm`).

`python -m factory.launch.warm_server SOCKET OWNER_FD [--first=N] MODULE...` binds SOCKET, imports the
modules, and serves until the pipe OWNER_FD closes (its launcher closed it, or died). It stays single-threaded
(a select loop; SIGCHLD wakes it) so that every fork copies a process in a known state. It imports and
never computes: the native threads that imports start (jemalloc's background thread, the BLAS pool) are
made again in a child by their own fork handlers, but a process that has run a torch operator in
parallel holds an OpenMP pool, and a child forked from it hangs at its first parallel operator.
Its imports wait, up to HOLD_S (FACTORY_WARM_HOLD_S, 2 s), while no child runs and a launch is likely to come.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from factory.launch.ending import end, tell_exit_on
from factory.launch.warm import receive_request

STARTED_NS = time.time_ns()
"""When this server started, before it stamped or imported anything."""
HOLD_S = float(os.environ.get("FACTORY_WARM_HOLD_S", "2"))
"""How long the imports wait, while no stage forked from the server runs, for the launch that is likely to come: an import
cannot be interrupted, and one begun just before a launch (torch's takes a second or two) would hold that stage up."""


def serve(socket_path: str, owner: int, modules: Sequence[str], first: int | None = None) -> None:
    """Bind, import `modules`, then fork a child for every launch until the owner's pipe closes. The imports go on while a
    child runs; while none does, a launch is likely to come (the first one once the `first` modules, what it needs, are
    imported; the next one after a child ends), and they wait for it up to HOLD_S."""
    # Ctrl-C goes to the whole process group (the stages too); the server lives on to report how they ended.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select below when a child ends
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    signal.signal(signal.SIGTERM, lambda number, _: _end_by(number, socket_path))  # (its children are reset to the default)
    base_env = dict(os.environ)  # what a launch's environment is compared with
    modules = list(modules)  # and those a later block asks for (`_preload`)
    sources = _source_stamps(modules)  # the code on disk as the imports begin
    installed = _installed_stamps()
    pending, problem = list(modules), None
    waiting: dict[int, socket.socket] = {}
    first = len(modules) if first is None else first
    held_until: float | None = None  # while no child runs: when the imports go on if no launch came
    while True:
        # Imports go one module at a time between launches: a launch is served with what is imported so far (the child
        # imports the rest itself), so the first stage does not wait for code only later stages need.
        if waiting:
            held_until = None  # a child runs; when the last one ends, the next launch is likely to come
        elif held_until is None and len(modules) - len(pending) >= first:
            held_until = time.monotonic() + HOLD_S  # before the first launch, or since the last child ended
        held = max(0.0, held_until - time.monotonic()) if held_until is not None else 0.0
        importing = bool(pending) and problem is None and held == 0.0
        wait = 0 if importing else held if pending and problem is None else None
        ready = select.select([listener, owner, wake_read], [], [], wait)[0]
        if owner in ready:
            _remove_socket(socket_path)
            return
        if wake_read in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_read, 512):
                    pass
        running, asked = bool(waiting), len(pending)
        _report_exits(waiting)
        if listener in ready:
            problem = _launch(listener, modules, pending, problem, (sources, installed), base_env, waiting, [owner, wake_read, wake_write])
            if len(pending) > asked and not waiting:  # a later block's modules (`_preload`): its first launch is likely to come
                held_until = time.monotonic() + HOLD_S
        elif importing and (waiting or not running):  # not when the last child just ended: the loop holds first
            problem = _import(pending.pop(0))


def _remove_socket(socket_path: str) -> None:
    """Remove the socket and the directory its launcher made for it, where nothing else is in it: a launcher that was
    killed never does, and its server is the last to know the path."""
    with contextlib.suppress(OSError):
        os.unlink(socket_path)
        os.rmdir(os.path.dirname(socket_path))


def _end_by(number: int, socket_path: str) -> None:
    """End as the signal `number` ends a process (SIGTERM, sent to a whole process group as `factory ui` is stopped), its
    socket removed first."""
    _remove_socket(socket_path)
    signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)


def _launch(listener: socket.socket, modules: list[str], pending: list[str], problem: str | None,
            stamps: tuple[dict[str, tuple[int, int]], Mapping[str, int]], base_env: Mapping[str, str],
            waiting: dict[int, socket.socket], private: list[int]) -> str | None:
    """Answer one request: how far the imports are and whether anything is stale (taking the modules it asks to
    `preload`, when nothing is), or a launch (import what it needs that is not imported yet, then fork its child, or say
    why not); why the server cannot fork from now on, if an import it did failed."""
    connection, _ = listener.accept()
    try:
        request, fds = receive_request(connection)
    except (OSError, ValueError, struct.error):
        connection.close()
        return problem
    try:
        sources, installed = stamps
        for name in [module for module in request.get("needs", ()) if module in pending or module not in sys.modules]:
            if problem is None:
                if name in pending:
                    pending.remove(name)
                problem = _import(name)
        if "status" in request:
            stale = _stale(sources) or _reinstalled(installed)
            if stale is None and problem is None:
                stale = _preload(request.get("preload", ()), modules, pending, sources)
            imported = {"imported": len(modules) - len(pending), "modules": len(modules)}
            _answer(connection, {**imported, "problem": problem or _threads(), "stale": stale})
            connection.close()
            return problem
        refused = problem or _threads() or _stale(sources) or _env_differs(base_env, request["env"], request["launch"])
        if refused:
            _answer(connection, {"refused": refused})
            connection.close()
            return problem
        imported_env = _changes(base_env, os.environ)  # what the imports set (mlflow does): a cold start sets it too
        gc.freeze()  # the imported modules' objects: the child's collector never walks (nor copies, by touching) them
        pid = os.fork()
        if pid == 0:
            _child(request, imported_env, fds, [listener.fileno(), connection.fileno(), *private, *(c.fileno() for c in waiting.values())])
        waiting[pid] = connection
        _answer(connection, {"pid": pid})
    finally:
        for fd in fds:
            os.close(fd)
    return problem


def _preload(names: Iterable[str], modules: list[str], pending: list[str], sources: dict[str, tuple[int, int]]) -> str | None:
    """Import `names` too, one at a time between launches as the first ones: a later block of the same launcher needs
    other stages' code. The sources of packages not stamped yet are stamped now; one the server imported already (with
    an earlier module) must have no file changed since the server started. What is stale, else None."""
    new = [name for name in dict.fromkeys(names) if name not in modules]
    stamped, late = {name.split(".")[0] for name in modules}, {}
    for package in dict.fromkeys(name.split(".")[0] for name in new):
        if package not in stamped:
            stamps = _source_stamps([package])
            changed = [path for path, (_, mtime) in stamps.items() if mtime > STARTED_NS]
            if changed and package in sys.modules:
                return f"{changed[0]} changed since the warm interpreter started"
            late.update(stamps)
    sources.update(late)
    modules.extend(new)
    pending.extend(new)
    return None


def _import(name: str) -> str | None:
    """Import one module; why the server cannot fork once it failed, else None."""
    try:
        importlib.import_module(name)
    except BaseException as e:  # noqa: BLE001 - any failure means: start cold, where the stage reports it itself
        return f"{name} did not import ({type(e).__name__}: {e})"
    return None


def _threads() -> str | None:
    """Why a fork now would not copy the whole process: a Python thread besides this one (None: there is none)."""
    if (threads := threading.active_count()) == 1:
        return None
    names = ", ".join(thread.name for thread in threading.enumerate() if thread is not threading.main_thread())
    return f"the warm interpreter runs {threads - 1} other Python thread(s) ({names}); a fork would copy only one"


def _source_stamps(modules: Sequence[str]) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every Python source file of the packages the modules belong to, but for those installed in a
    directory of installed packages (torch's 2,300 files, say), whose changes `_installed_stamps` sees: a launch then
    checks the project's own files (about 200), not 2,800 (39 ms a launch)."""
    installed = tuple(os.path.join(directory, "") for directory in _installed_stamps())
    stamps = {}
    for package in dict.fromkeys(name.split(".")[0] for name in modules):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):  # no such package: its import fails, and says so
            continue
        for root in (spec.submodule_search_locations or []) if spec else []:
            if os.path.join(os.path.abspath(root), "").startswith(installed):
                continue
            for path in Path(root).rglob("*.py"):
                with contextlib.suppress(OSError):  # a dangling link (an editor's lock file), a file just removed
                    info = path.stat()
                    stamps[str(path)] = (info.st_size, info.st_mtime_ns)
    return stamps


def _stale(sources: Mapping[str, tuple[int, int]]) -> str | None:
    """Which source file changed since the server imported its package (None: none did)."""
    for path, stamp in sources.items():
        try:
            info = os.stat(path)
        except OSError:
            return f"{path} was removed since the warm interpreter started"
        if (info.st_size, info.st_mtime_ns) != stamp:
            return f"{path} changed since the warm interpreter started"
    roots = {str(Path(path).parent) for path in sources}
    for root in roots:
        for name in os.listdir(root):
            if name.endswith(".py") and os.path.join(root, name) not in sources:
                return f"{os.path.join(root, name)} appeared since the warm interpreter started"
    return None


def _installed_stamps() -> dict[str, int]:
    """The modification time of each directory of installed packages on the path: installing, upgrading or removing a
    package adds or removes entries there."""
    stamps = {}
    for entry in sys.path[1:]:  # the first is the working directory, which stages write to
        if os.path.basename(entry) in ("site-packages", "dist-packages") and os.path.isdir(entry):
            stamps[entry] = os.stat(entry).st_mtime_ns
    return stamps


def _reinstalled(installed: Mapping[str, int]) -> str | None:
    """Which directory of installed packages changed since the server started (None: none did)."""
    for path, stamp in installed.items():
        with contextlib.suppress(OSError):
            if os.stat(path).st_mtime_ns != stamp:
                return f"packages in {path} were installed or removed since the warm interpreter started"
    return None


def _env_differs(base: Mapping[str, str], env: Mapping[str, str], launch: Iterable[str]) -> str | None:
    """Which variables differ from the server's, other than those the launch sets (None: none)."""
    own = set(launch)
    names = sorted(name for name in base.keys() | env.keys() if name not in own and base.get(name) != env.get(name))
    return f"the environment differs from the warm interpreter's in {', '.join(names)}" if names else None


def _answer(connection: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the launcher went away: nobody to tell
        connection.sendall(json.dumps(message).encode() + b"\n")


def _report_exits(waiting: dict[int, socket.socket]) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = waiting.pop(pid, None)
        if connection is not None:
            _answer(connection, {"exit": os.waitstatus_to_exitcode(status)})
            connection.close()


def _changes(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, str | None]:
    """The variables `after` sets to another value than `before` (None: removed)."""
    changed: dict[str, str | None] = {name: value for name, value in after.items() if before.get(name) != value}
    return {**changed, **dict.fromkeys(before.keys() - after.keys())}


def _child(request: dict[str, Any], imported_env: Mapping[str, str | None], fds: list[int], inherited: list[int]) -> None:
    """Become the stage: its stdio, directory, environment and arguments; run its module as `__main__`; never return."""
    code = 1
    tell_exit_on(fds[3] if len(fds) > 3 else None)  # first: a rank forked from a stage (`run_as_main`) tells nobody
    try:
        signal.set_wakeup_fd(-1)
        for number in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in inherited:
            with contextlib.suppress(OSError):
                os.close(fd)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        if len(fds) > 3:  # where the launcher reads the exit code: not passed on to a program the stage runs
            os.set_inheritable(fds[3], False)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for name, value in imported_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        import tempfile

        tempfile.tempdir = None  # asked again, of the launch's TMPDIR, as a cold start asks (torch's import asked the server's)
        sys.path[0] = request["cwd"]  # as `python -m` puts the working directory first
        sys.argv = [request["module"], *request["args"]]
        import atexit
        import random

        atexit._clear()  # the server's exit handlers are not the stage's
        random.seed()  # a cold start seeds `random` from the OS; a fork would share the server's state
        try:
            import runpy

            # Run afresh as `__main__`, as a cold start does: the copy the server preloaded (its imports are what it
            # saved) would make runpy warn that the module is in sys.modules already.
            for name in (request["module"], request["module"] + ".__main__"):
                if not hasattr(sys.modules.get(name), "__path__"):
                    sys.modules.pop(name, None)
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = _exit_code(e.code)
        except KeyboardInterrupt:
            code = -signal.SIGINT
        except BaseException:  # noqa: BLE001 - printed as an uncaught exception would be
            import traceback

            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if code < 0:  # die of the signal, as a cold process would
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        end(code)


def run_as_main(module: str, args: Sequence[str]) -> None:
    """Become `python -m MODULE ARGS` in this process, as it is (its stdio, directory and environment), as a forked child
    of the server does; never return."""
    _child({"module": module, "args": list(args), "cwd": os.getcwd(), "env": dict(os.environ)}, {}, [0, 1, 2], [])


def _exit_code(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    """`python -m factory.launch.warm_server SOCKET OWNER_FD [--first=N] MODULE...`"""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print("usage: python -m factory.launch.warm_server SOCKET OWNER_FD [--first=N] MODULE...", file=sys.stderr)
        return 2
    first = int(args.pop(2).partition("=")[2]) if len(args) > 2 and args[2].startswith("--first=") else None
    serve(args[0], int(args[1]), args[2:], first)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # nothing to flush or close: unloading what it imported (torch...) would only hold its launcher up
