"""The sandbox's view of the filesystem, as a command line: what it binds is all there is inside."""

import os
import sys
from pathlib import Path

import pytest

from factory.post.sandbox_mounts import PRIVATE_TMPFS, WORKDIR, bwrap_argv, interpreter_prefix, package_paths


def options(argv: list[str], flag: str, arity: int) -> list[tuple[str, ...]]:
    return [tuple(argv[i + 1:i + 1 + arity]) for i, word in enumerate(argv[:argv.index("--")]) if word == flag]


def test_only_the_interpreter_and_system_directories_are_bound_and_read_only():
    argv = bwrap_argv(sys.executable, 8 << 20)
    prefix = str(interpreter_prefix(sys.executable))
    assert options(argv, "--bind", 2) == [] and options(argv, "--dev-bind", 2) == [(d, d) for d in ("/dev/null", "/dev/zero", "/dev/urandom")]
    bound = [source for source, _ in options(argv, "--ro-bind", 2)]
    assert prefix in bound and all(path == prefix or path in ("/usr", "/lib", "/lib64", "/bin", "/sbin") for path in bound)
    assert not any(path.startswith(("/etc", "/work", "/proc", "/home")) for path in bound)
    assert argv[argv.index("--") + 1] == os.path.realpath(sys.executable)


def test_every_writable_place_is_a_private_size_capped_tmpfs_and_the_namespace_init_is_hidden():
    argv = bwrap_argv(sys.executable, 8 << 20)
    tmpfs = [argv[i + 1] for i, word in enumerate(argv) if word == "--tmpfs"]
    assert set(PRIVATE_TMPFS) <= set(tmpfs) and {"/proc/1", "/dev"} <= set(tmpfs)
    assert all(argv[argv.index(path) - 2] == str(8 << 20) for path in PRIVATE_TMPFS)
    assert argv[argv.index("--chdir") + 1] == WORKDIR and "--unshare-pid" in argv and "--unshare-net" in argv


def test_every_directory_above_a_bound_path_is_made_enterable_in_the_namespace_before_the_bind():
    """Bubblewrap would make them 0700, which the sandbox's uid cannot enter (an interpreter under /root, a venv)."""
    pytest.importorskip("numpy")
    entries, sites = package_paths(["numpy"])
    argv = bwrap_argv(sys.executable, 8 << 20, entries)
    binds = [target for _, target in options(argv, "--ro-bind", 2)]
    assert {str(path) for path in entries} <= set(binds) and all(path.parent in sites for path in entries)
    made = {argv[i + 3]: i for i in range(len(argv) - 3) if argv[i:i + 3] == ["--perms", "0755", "--dir"]}
    for target in binds:
        for parent in Path(target).parents[:-1]:
            inside_earlier_bind = any(parent.is_relative_to(earlier) for earlier in binds[:binds.index(target)])
            assert inside_earlier_bind or made.get(str(parent), len(argv)) < argv.index(target), (target, parent)
