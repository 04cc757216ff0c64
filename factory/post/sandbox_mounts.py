"""The sandbox's filesystem: a bubblewrap command line that gives one execution a world of its own.

Built by a pure function (what to show in, argv out) so the view can be tested by equality. Inside the
mount namespace the code sees only the interpreter's prefix, the packages it was given (`package_paths`)
and the system libraries under /usr (read-only), a size-capped private tmpfs for its working directory
and each world-writable place (/tmp, /var/tmp, /run/lock, /dev/shm), a /dev of null, zero and urandom,
and a /proc of its own pid namespace in which the namespace's init (pid 1, bubblewrap's reaper) is
hidden: nothing of the registry, the catalog, the repository, /etc, /root or other processes. It still
starts as root (so `confine` can prepare and then drop to its own uid), holding only CAP_SETUID and
CAP_SETGID, which the drop clears.

A bound path keeps its host path, so the interpreter finds its stdlib where it was built to look. Bubblewrap
would make the missing directories above it itself, mode 0700 (as root), which the sandbox's uid cannot enter
(an interpreter under /root/.pyenv, a venv under /work). So each of those directories is made first, 0755 and
empty, in the namespace's own root; the host's directories keep their modes.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path

from factory.errors import ConfigError

WORKDIR = "/sandbox"
"""The execution's private working directory inside the namespace (a tmpfs: nothing of it reaches the host)."""
PRIVATE_TMPFS = (WORKDIR, "/tmp", "/var/tmp", "/run/lock", "/dev/shm")
"""Writable places inside the namespace: each its own size-capped tmpfs, gone when the execution ends."""
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Where the interpreter's shared libraries live: bound read-only, or re-created as the symlinks they are (merged /usr)."""


def interpreter_prefix(python: str) -> Path:
    """The installation the interpreter runs from (its stdlib and libpython), resolved through venvs and symlinks."""
    real = Path(os.path.realpath(python))
    base = Path(os.path.realpath(sys.base_prefix))
    return base if real.is_relative_to(base) else real.parent.parent


def package_paths(names: Sequence[str]) -> tuple[list[Path], list[Path]]:
    """What makes the installed distributions `names` importable: the top-level files and directories each installed
    (its modules, vendored libraries and metadata: to bind read-only) and the directories holding them (for sys.path)."""
    entries: dict[Path, None] = {}
    sites: dict[Path, None] = {}
    for name in names:
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError as e:
            raise ConfigError(f"sandbox package {name!r} is not installed for {sys.executable}: install it there "
                              f"(pip install {name}) or take it out of the sandbox's packages") from e
        site = Path(distribution.locate_file(""))
        sites[site] = None
        tops = sorted({path.parts[0] for path in distribution.files or () if path.parts[0] not in ("..", "__pycache__")})
        entries.update((site / top, None) for top in tops if (site / top).exists())
    return list(entries), list(sites)


def bwrap_argv(python: str, tmpfs_bytes: int, packages: Sequence[Path] = ()) -> list[str]:
    """The bubblewrap command that runs `python` (resolved) in a fresh mount, pid, network, IPC and UTS namespace, with
    `packages` (files and directories from `package_paths`) bound read-only where they are on the host."""
    real = os.path.realpath(python)
    argv = ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "sandbox", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    bound = []
    for directory in SYSTEM_DIRS:
        if os.path.islink(directory):
            argv += ["--symlink", os.readlink(directory), directory]
        elif os.path.isdir(directory):
            argv += ["--ro-bind", directory, directory]
            bound.append(Path(directory))
    argv += _bind_read_only([interpreter_prefix(python), *packages], bound)
    argv += ["--proc", "/proc", "--perms", "0555", "--size", "4096", "--tmpfs", "/proc/1", "--tmpfs", "/dev"]
    for device in DEVICES:
        argv += ["--dev-bind", device, device]
    for path in PRIVATE_TMPFS:
        argv += ["--perms", "1777", "--size", str(tmpfs_bytes), "--tmpfs", path]
    return [*argv, "--chdir", WORKDIR, "--", real]


def _bind_read_only(paths: Iterable[Path], bound: Sequence[Path]) -> list[str]:
    """Bind each path read-only at its own place, after making the directories above it enterable (0755) in the
    namespace; a path inside one `bound` or bound before it is there already."""
    argv: list[str] = []
    made: set[Path] = set()
    bound = list(bound)
    for path in paths:
        if any(Path(os.path.realpath(path)).is_relative_to(os.path.realpath(b)) for b in bound):
            continue
        for parent in reversed(path.parents[:-1]):  # outermost first; never "/" itself
            if parent not in made:
                argv += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        argv += ["--ro-bind", str(path), str(path)]
        bound.append(path)
    return argv


@functools.cache
def bwrap_works() -> bool:
    """Whether bubblewrap is installed and can build the sandbox's namespaces here (root, or a kernel that allows it)."""
    if shutil.which("bwrap") is None:
        return False
    try:
        argv = bwrap_argv(sys.executable, 1 << 20)
        return subprocess.run([*argv, "-S", "-c", "pass"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
