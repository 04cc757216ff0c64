"""The local launcher: a stage as a child process of this machine, its output streamed through."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from factory.errors import LaunchError, StageFailed

STAGE_MODULE = "factory.stages"
STDERR_TAIL_LINES = 20


def stage_argv(request_path: Path, python: str = sys.executable, processes: int = 1) -> list[str]:
    """The command that runs one stage from its request file: one process, or `processes` ranks under torchrun."""
    if processes > 1:
        return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", "-m", STAGE_MODULE, str(request_path)]
    return [python, "-m", STAGE_MODULE, str(request_path)]


class LocalLauncher:
    """Runs a stage command as a child process and waits for it."""

    def run(self, argv: list[str], env: Mapping[str, str], name: str) -> None:
        """Run `argv` with `env` added to this process's environment; raise StageFailed on a non-zero exit."""
        try:
            process = subprocess.Popen(argv, env={**os.environ, **env}, stderr=subprocess.PIPE, text=True, bufsize=1)
        except OSError as e:
            raise LaunchError(f"cannot start stage {name!r} ({argv[0]}): {e}") from e
        tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        pump = threading.Thread(target=_tee, args=(process.stderr, tail), daemon=True)
        pump.start()
        try:
            code = process.wait()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            pump.join()
        if code != 0:
            detail = "".join(tail).strip() or "(no output on stderr)"
            raise StageFailed(f"stage {name!r} exited with code {code}:\n{detail}")


def _tee(stream: IO[str], tail: collections.deque[str]) -> None:
    for line in stream:
        sys.stderr.write(line)
        tail.append(line)
