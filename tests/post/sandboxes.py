"""The sandbox in each of its isolation modes, built on this host by taking away what the mode lacks, never adding it."""

import os

import pytest

from factory.post import sandbox as sandbox_module
from factory.post.sandbox import Limits, Sandbox

ROOT = os.geteuid() == 0
LIMITS = Limits(cpu_s=1, wall_s=3, memory_mb=256, file_mb=1, output_bytes=10_000)
ISOLATION = {
    "namespaces": "own uid; mount, pid, network and IPC namespaces",
    "unshare": "own uid, network and IPC namespaces",
    "own uid": "own uid; the host's files and network reachable",
    "hook only": "limits and audit hook only",
}
"""Each mode and how `Sandbox.isolation` begins in it: bubblewrap; `unshare` without a mount namespace; root with
neither; no root (as root here, the code runs as root with only the limits and the hook: no test beats the hook there)."""
MODES = tuple(ISOLATION)
ROOT_MODES = MODES[:3]


def build(mode: str, limits: Limits = LIMITS, **options) -> Sandbox:
    """A sandbox in `mode`; fails when this host cannot give the mode it should (bubblewrap missing), skips when the
    test does not run as root (only "hook only" exists then)."""
    if mode != "hook only" and not ROOT:
        pytest.skip(f"the {mode!r} mode needs root; without it the sandbox only has its limits and the audit hook")
    with pytest.MonkeyPatch.context() as patch:
        if mode in ("own uid", "hook only"):
            patch.setattr(sandbox_module, "_unshare_works", lambda: False)
        if mode == "hook only":
            patch.setattr(sandbox_module.os, "geteuid", lambda: 1000)
        sandbox = Sandbox(limits, mount_namespace=mode == "namespaces", **options)
    assert sandbox.isolation.startswith(ISOLATION[mode]), \
        f"{mode}: {sandbox.isolation} (no bubblewrap or unshare? `apt-get install bubblewrap`, which `make test` does)"
    return sandbox
