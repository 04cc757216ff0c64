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
    return _git_raw(cwd, *args).strip()


def _git_raw(cwd: str | Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=30)
    return result.stdout


def head_commit(cwd: str | Path = ".") -> str | None:
    """HEAD's commit sha, or None outside a git repository or before the first commit."""
    try:
        return _git(cwd, "rev-parse", "--verify", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        return None


def files_at_commit(directory: str | Path, commit: str, suffix: str = ".md") -> dict[Path, str]:
    """{absolute path: text} of the files directly in `directory` as they are at `commit`."""
    cwd = Path(directory)
    root = Path(_git(cwd, "rev-parse", "--show-toplevel"))
    prefix = Path(directory).resolve().relative_to(root).as_posix()
    listing = _git(root, "ls-tree", "-r", "--name-only", commit, "--", prefix)
    names = [name for name in listing.splitlines() if name.endswith(suffix) and "/" not in name[len(prefix) + 1 :]]
    return {root / name: _git_raw(root, "show", f"{commit}:{name}") for name in names}
