"""torchrun whose ranks fork from it: `python -m factory.runtime.ranks TORCHRUN-OPTIONS -m MODULE ARGS...`.

torchrun starts each rank as a fresh interpreter (`python -u -m MODULE ARGS`), which spends seconds importing torch and
the stage's code before its first step, even when torchrun itself was forked from the warm interpreter
(`factory.launch.warm`) that had imported all of it. This is torchrun (its argument parser, elastic agent, rendezvous,
monitoring, `--tee` prefixes and failure report) with one difference: the agent starts each rank as a function in a
process it forks (torch's `start_method="fork"`), and that process forks the rank, which runs MODULE as `__main__`
the way a forked stage does (`factory.launch.warm_server.run_as_main`): its own exit handlers and `random` state,
the environment the agent gives it (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR...), and torch's intra-op threads set
from OMP_NUM_THREADS, which a fresh interpreter reads at start (torchrun sets it to 1 for several ranks).

Why two forks: a rank ends with `os._exit` (`factory.runtime.report.exit_now`), and the agent waits for a function's
return value before it reaps its process. So the process the agent started waits for the rank and ends as it did:
its exit code, or killed by the same signal. SIGTERM (how the agent stops its workers) is passed on; the rank dies with
it (SIGKILL, `PR_SET_PDEATHSIG`) when it is killed; SIGINT from a terminal reaches the rank itself, as it reaches a
cold one. The agent forks while its rendezvous threads run, as torch's fork start method does; the ranks use none of
the agent's locks or connections. As for every forked process, /proc/PID/environ (`ps e`) shows the environment the
warm interpreter started with, not the rank's; a test that looks for a rank by its RANK variable asks the rank itself.

The local launcher runs it in place of torchrun for a stage of several ranks forked from the warm interpreter
(`factory.launch.local.RANKS_MODULE`), and torchrun otherwise. Linux only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import uuid

MODULE = "factory.runtime.ranks"
PR_SET_PDEATHSIG = 1


def rank(*argv: str) -> None:
    """One rank: torchrun's command after the interpreter (`-u -m MODULE ARGS...`), in a process forked from this one."""
    flags = list(argv)
    unbuffered = flags[:1] == ["-u"]
    if unbuffered:
        flags.pop(0)
    if flags[:1] != ["-m"] or len(flags) < 2:
        raise SystemExit(f"{MODULE}: a rank runs a module (-m MODULE), not {' '.join(argv)!r}")
    module, arguments = flags[1], flags[2:]
    waiter = os.getpid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # before the fork: a Ctrl-C meant for the rank does not end its waiter
    pid = os.fork()
    if pid == 0:
        _become(module, arguments, unbuffered, waiter)
    signal.signal(signal.SIGTERM, lambda number, _: os.kill(pid, number))
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # die of the rank's signal, as the rank the agent would have started
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    if code:
        raise SystemExit(code)


def _become(module: str, arguments: list[str], unbuffered: bool, waiter: int) -> None:
    """Die with the waiting process, then run MODULE as `__main__`; never return."""
    from factory.launch.warm_server import run_as_main

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != waiter:  # the waiter died before the line above took effect
        os._exit(128 + signal.SIGKILL)
    if unbuffered:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(line_buffering=True, write_through=True)
    if threads := os.environ.get("OMP_NUM_THREADS", "").strip():
        with contextlib.suppress(ValueError, ImportError):
            import torch

            torch.set_num_threads(int(threads))
    run_as_main(module, arguments)


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
        config, _, command = config_from_args(args)
        config.start_method = "fork"
        elastic_launch(config=config, entrypoint=rank)(*command)

    launch()


if __name__ == "__main__":
    main()
