"""torchrun whose ranks fork from it: `python -m factory.runtime.ranks TORCHRUN-OPTIONS -m MODULE ARGS...`.

torchrun starts each rank as a fresh interpreter (`python -u -m MODULE ARGS`), which spends seconds importing torch and
the stage's code before its first step, even when torchrun itself was forked from the warm interpreter
(`factory.launch.warm`) that had imported all of it. This is torchrun (its argument parser, elastic agent, rendezvous,
monitoring, `--tee` prefixes and failure report) with one difference: the agent starts each rank as a function in a
process it forks (torch's `start_method="fork"`), and that process forks the rank, which runs MODULE as `__main__`
the way a forked stage does (`factory.launch.warm_server.run_as_main`): its own exit handlers and `random` state,
the environment the agent gives it (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR...), and torch's intra-op threads set
from OMP_NUM_THREADS, which a fresh interpreter reads at start (torchrun sets it to 1 for several ranks).

Why two forks: a rank ends with `os._exit` (`factory.launch.ending.exit_now`), and the agent waits for a function's
return value before it reaps its process. So the process the agent started waits for the rank and ends as it did: its
exit code, or killed by the same signal. The rank runs in a session of its own, as torchrun starts one; the stops the
agent sends (SIGTERM, SIGINT, SIGHUP, SIGQUIT) are passed on to that session, and so is a SIGTERM when the agent dies;
the rank dies with its waiting process (SIGKILL, `PR_SET_PDEATHSIG`), which leaves none behind. The agent forks while its
rendezvous threads run, as torch's fork start method does; the ranks use none of the agent's locks or connections, and
start with the signal handlers of a fresh interpreter. A rank that could not use CUDA because the agent initialised it
(a forked process cannot) starts afresh instead: torch's configuration asks whether CUDA is there through NVML, which
leaves the fork usable. As for every forked process, /proc/PID/environ (`ps e`) shows the environment the warm
interpreter started with, not the rank's; a test that looks for a rank by its RANK variable asks the rank itself.
What a forked rank shares with its siblings and a fresh one would not: numpy's BLAS threads, sized when the warm
interpreter imported it, and Python's hash seed.

The local launcher runs it in place of torchrun for a stage of several ranks forked from the warm interpreter
(`factory.launch.local.RANKS_MODULE`), and torchrun otherwise. Linux only.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import signal
import sys
import uuid

MODULE = "factory.runtime.ranks"
PR_SET_PDEATHSIG = 1
STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
"""The signals torch's agent stops its workers with: the process it started passes them on to the rank."""
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
"""Set while torch's launch configuration asks whether CUDA is there: asked through NVML, the question does not make a
forked process unable to use CUDA."""


def rank(*argv: str) -> None:
    """One rank: torchrun's command after the interpreter (`-u -m MODULE ARGS...`), in a process forked from this one."""
    flags = list(argv)
    unbuffered = flags[:1] == ["-u"]
    if unbuffered:
        flags.pop(0)
    if flags[:1] != ["-m"] or len(flags) < 2:
        raise SystemExit(f"{MODULE}: a rank runs a module (-m MODULE), not {' '.join(argv)!r}")
    module, arguments = flags[1], flags[2:]
    waiter, agent = os.getpid(), os.getppid()
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)  # a stop that comes during the fork waits for the handlers below
    pid = os.fork()
    if pid == 0:
        try:
            _become(module, arguments, unbuffered, waiter)
        finally:
            os._exit(1)

    def stop(number: int, _: object) -> None:  # to the rank's session: the rank and what it started, as torchrun stops one
        try:
            os.killpg(pid, number)
        except ProcessLookupError:  # not its own session yet: the rank alone, where it waits with the signal blocked
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, number)

    for number in STOPS:
        signal.signal(number, stop)
    _die_with_parent(signal.SIGTERM)  # a killed agent stops the rank, through `stop`
    if os.getppid() != agent:
        stop(signal.SIGTERM, None)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    _, status = os.waitpid(pid, 0)
    for number in STOPS:  # the rank is gone: a stop now ends this process, as it would have ended the rank
        signal.signal(number, signal.SIG_DFL)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # die of the rank's signal, as the rank the agent would have started
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)  # SIGPIPE, say, which Python ignores
        os.kill(os.getpid(), -code)
    if code:
        raise SystemExit(code)


def _become(module: str, arguments: list[str], unbuffered: bool, waiter: int) -> None:
    """The rank: a session of its own that dies with the waiting process, the signal handlers of a fresh interpreter,
    then MODULE as `__main__`; never returns."""
    import torch

    from factory.launch.warm_server import run_as_main

    os.setsid()
    _die_with_parent(signal.SIGKILL)
    if os.getppid() != waiter:  # the waiter died before the line above took effect
        os._exit(128 + signal.SIGKILL)
    for number in STOPS:  # the agent's handlers (torch's, which raise) are not a fresh interpreter's
        signal.signal(number, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    command = [sys.executable, *(["-u"] if unbuffered else []), "-m", module, *arguments]
    if torch.cuda._is_in_bad_fork():  # the agent initialised CUDA, which a forked process cannot use: start afresh
        os.execv(sys.executable, command)
    if unbuffered:  # as `python -u` makes them: text written through to the file, no buffer below it
        for name, fd in (("stdout", 1), ("stderr", 2)):
            old = getattr(sys, name)
            setattr(sys, name, io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=old.encoding, errors=old.errors,
                                                write_through=True))
    if threads := os.environ.get("OMP_NUM_THREADS", "").strip():
        with contextlib.suppress(ValueError, RuntimeError):  # a value a fresh interpreter would ignore is ignored here too
            torch.set_num_threads(int(threads))
    run_as_main(module, arguments)


def _die_with_parent(number: int) -> None:
    """Have the kernel send this process `number` when its parent dies (Linux's PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, number)


def main(argv: list[str] | None = None) -> None:
    """torchrun's command line, each rank started by `rank`."""
    from torch.distributed.elastic.multiprocessing.errors import record
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    @record
    def launch() -> None:
        args = parse_args(argv)
        if not args.module:
            raise SystemExit(f"{MODULE}: ranks run a module: give -m MODULE")
        if args.standalone:  # one machine: a rendezvous of its own on a free port, as torchrun --standalone makes
            args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
        if args.master_port is None:
            args.master_port = 29500
        given = os.environ.get(NVML_CHECK)
        os.environ[NVML_CHECK] = "1"
        try:
            config, _, command = config_from_args(args)
        finally:
            if given is None:
                del os.environ[NVML_CHECK]
            else:
                os.environ[NVML_CHECK] = given
        config.start_method = "fork"
        elastic_launch(config=config, entrypoint=rank)(*command)

    launch()


if __name__ == "__main__":
    main()
