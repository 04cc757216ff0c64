"""Where a run came from: the git commit of the working tree that asked for it."""

from __future__ import annotations

import subprocess
from pathlib import Path

UNKNOWN_COMMIT = "unknown"


def git_commit(cwd: str | Path = ".") -> str:
    """HEAD's commit, suffixed `-dirty` when tracked files have uncommitted changes."""
    try:
        head = _git(cwd, "rev-parse", "HEAD")
        dirty = _git(cwd, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return UNKNOWN_COMMIT
    return head + ("-dirty" if dirty else "")


def _git(cwd: str | Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=30)
    return result.stdout.strip()
