"""The sandbox's filesystem: a bubblewrap command line that gives one execution a world of its own.

Built by a pure function (what to show in, argv out) so the view can be tested by equality. Inside the
mount namespace the code sees only the interpreter's prefix and the system libraries under /usr (read-only),
a size-capped private tmpfs for its working directory and each world-writable place (/tmp, /var/tmp,
/run/lock, /dev/shm), a /dev of null, zero and urandom, and a /proc of its own pid namespace in which the
namespace's init (pid 1, bubblewrap's reaper) is hidden: nothing of the registry, the catalog, the
repository, /etc, /root or other processes. It still starts as root (so `confine` can import and then
drop to its own uid), holding only CAP_SETUID and CAP_SETGID, which the drop clears.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

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


def bwrap_argv(python: str, tmpfs_bytes: int) -> list[str]:
    """The bubblewrap command that runs `python` (resolved) in a fresh mount, pid, network, IPC and UTS namespace."""
    real = os.path.realpath(python)
    prefix = str(interpreter_prefix(python))
    argv = ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "sandbox", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    for directory in SYSTEM_DIRS:
        if os.path.islink(directory):
            argv += ["--symlink", os.readlink(directory), directory]
        elif os.path.isdir(directory):
            argv += ["--ro-bind", directory, directory]
    argv += ["--ro-bind", prefix, prefix, "--proc", "/proc", "--perms", "0555", "--size", "4096", "--tmpfs", "/proc/1",
             "--tmpfs", "/dev"]
    for device in DEVICES:
        argv += ["--dev-bind", device, device]
    for path in PRIVATE_TMPFS:
        argv += ["--perms", "1777", "--size", str(tmpfs_bytes), "--tmpfs", path]
    return [*argv, "--chdir", WORKDIR, "--", real]


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
