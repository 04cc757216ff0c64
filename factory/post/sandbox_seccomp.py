"""The sandbox's seccomp filter: no new namespaces from inside, whatever the code does to the audit hook.

An unprivileged process may `unshare(CLONE_NEWUSER)` on most kernels and then holds every
capability inside a user namespace of its own: a wide kernel surface (mounts, netfilter, ...)
for code that only has to compute. The filter, built here as a classic BPF program by a pure
function (machine in, bytes out), answers `unshare` and `setns` with EPERM, `clone` with any
namespace flag with EPERM, and `clone3` (whose flags sit behind a pointer the filter cannot read)
with ENOSYS, so the C library falls back to `clone`. A syscall of another ABI (x32, i386) ends
the process. `INSTALL` is the code the sandboxed interpreter runs to load it: prepared while it
may still read its own files, installed after it drops to its own uid, before the code is read.

Bubblewrap's `--disable-userns` would need `--unshare-user`, which maps a single uid into the
sandbox: `confine` could no longer drop to its own uid, and mapping that uid to root outside
would be worse. The filter holds on every path (bubblewrap, `unshare`, no root).
"""

from __future__ import annotations

import errno
import struct
from dataclasses import dataclass

LOAD_WORD = 0x20  # BPF_LD | BPF_W | BPF_ABS
JUMP_EQUAL = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JUMP_AT_LEAST = 0x35  # BPF_JMP | BPF_JGE | BPF_K
JUMP_ANY_BIT = 0x45  # BPF_JMP | BPF_JSET | BPF_K
RETURN = 0x06  # BPF_RET | BPF_K
ALLOW = 0x7FFF0000
KILL_PROCESS = 0x80000000
ERRNO = 0x00050000
NR_OFFSET, ARCH_OFFSET, FIRST_ARG_OFFSET = 0, 4, 16
"""Offsets in `struct seccomp_data`: the syscall number, the ABI, the low word of the first argument (little-endian)."""
NAMESPACE_FLAGS = 0x7E020080
"""CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME."""
X32_BIT = 0x40000000


@dataclass(frozen=True, kw_only=True, slots=True)
class Abi:
    """One machine's audit arch and the numbers of the syscalls the filter looks at."""

    arch: int
    unshare: int
    setns: int
    clone: int
    clone3: int
    x32: bool = False
    """Whether syscall numbers with X32_BIT are another ABI on this arch (x86_64's x32): refused."""


ABIS = {
    "x86_64": Abi(arch=0xC000003E, unshare=272, setns=308, clone=56, clone3=435, x32=True),
    "aarch64": Abi(arch=0xC00000B7, unshare=97, setns=268, clone=220, clone3=435),
}


def namespace_filter(machine: str) -> bytes | None:
    """The BPF program (`struct sock_filter` array) for `machine` (`platform.machine()`); None where the syscalls are unknown."""
    abi = ABIS.get(machine)
    if abi is None:
        return None
    # (code, jump-if-true label, jump-if-false label, k); labels name the return instructions at the end.
    program: list[tuple[int, str | None, str | None, int]] = [
        (LOAD_WORD, None, None, ARCH_OFFSET),
        (JUMP_EQUAL, None, "kill", abi.arch),
        (LOAD_WORD, None, None, NR_OFFSET),
    ]
    if abi.x32:
        program.append((JUMP_AT_LEAST, "kill", None, X32_BIT))
    program += [
        (JUMP_EQUAL, "eperm", None, abi.unshare),
        (JUMP_EQUAL, "eperm", None, abi.setns),
        (JUMP_EQUAL, "enosys", None, abi.clone3),
        (JUMP_EQUAL, None, "allow", abi.clone),
        (LOAD_WORD, None, None, FIRST_ARG_OFFSET),
        (JUMP_ANY_BIT, "eperm", "allow", NAMESPACE_FLAGS),
    ]
    returns = {"allow": ALLOW, "eperm": ERRNO | errno.EPERM, "enosys": ERRNO | errno.ENOSYS, "kill": KILL_PROCESS}
    at = {label: len(program) + i for i, label in enumerate(returns)}
    code = b""
    for index, (op, if_true, if_false, k) in enumerate(program):
        jump = [0 if label is None else at[label] - index - 1 for label in (if_true, if_false)]
        code += struct.pack("=HBBI", op, *jump, k)
    return code + b"".join(struct.pack("=HBBI", RETURN, 0, 0, value) for value in returns.values())


INSTALL = r"""
def filter_installer(program):
    # Imports and resolves everything now (the interpreter's files may be unreadable once privileges are dropped).
    import ctypes, sys
    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    code = ctypes.create_string_buffer(program, len(program))
    fprog = ctypes.cast(ctypes.pointer(Program(len(program) // 8, ctypes.cast(code, ctypes.c_char_p))), ctypes.c_void_p)
    get_errno = ctypes.get_errno
    for name in [m for m in sys.modules if m.partition(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]  # importing ctypes again goes through the audit hook

    def install():
        # PR_SET_NO_NEW_PRIVS (38), then PR_SET_SECCOMP (22) with SECCOMP_MODE_FILTER (2)
        if prctl(38, 1, None, 0, 0) != 0 or prctl(22, 2, fprog, 0, 0) != 0:
            raise OSError(get_errno(), "sandbox: the seccomp filter that keeps out new namespaces could not be installed")
    return install, code
"""
