"""The sandbox's view of the filesystem, as a command line: what it binds is all there is inside."""

import os
import sys

from factory.post.sandbox_mounts import PRIVATE_TMPFS, WORKDIR, bwrap_argv, interpreter_prefix


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
