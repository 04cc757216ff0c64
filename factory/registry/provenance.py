"""Where a run came from: the git commit of the working tree that asked for it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

UNKNOWN_COMMIT = "unknown"
FILE_STATES = {"??": "untracked", "!!": "ignored by git", "A": "added but not committed", "D": "deleted"}


def git_commit(cwd: str | Path = ".", files: Iterable[str | Path] = ()) -> str:
    """HEAD's commit, suffixed `-dirty` when tracked files have uncommitted changes or any of `files` (the experiment
    file a run reads) is not as HEAD holds it: untracked, ignored, modified or outside the repository."""
    try:
        head = _git(cwd, "rev-parse", "HEAD")
        dirty = _git(cwd, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return UNKNOWN_COMMIT
    return head + ("-dirty" if dirty or any(file_state(f) for f in files) else "")


def file_state(path: str | Path) -> str | None:
    """Why a file is not as its repository's HEAD holds it ("untracked", "modified", ...), or None when it is."""
    path = Path(path).resolve()
    try:
        status = _git_raw(path.parent, "status", "--porcelain", "--untracked-files=all", "--ignored", "--", path.name)
    except (OSError, subprocess.CalledProcessError):
        return "outside any git repository"
    if not status.strip():
        return None
    code = status[:2]
    return FILE_STATES.get(code) or FILE_STATES.get(code.strip()) or "modified"


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


def repo_root(cwd: str | Path) -> Path:
    """The top directory of the git working tree that holds `cwd`."""
    return Path(_git(Path(cwd), "rev-parse", "--show-toplevel"))


def files_at_commit(directory: str | Path, commit: str, suffix: str = ".md", max_bytes: int | None = None,
                    repo: str | Path | None = None, recursive: bool = False) -> dict[Path, str]:
    """{absolute path: text} of the regular files directly in `directory` (`recursive`: anywhere under it) as they are at
    `commit`; files larger than `max_bytes` are left out unread (as are symlinks and submodules). With `repo` (e.g. a bare
    clone), `directory` is a path inside it and the paths returned are under `repo`."""
    if repo is None:
        root = repo_root(directory)
        prefix = Path(directory).resolve().relative_to(root).as_posix()
    else:
        root, prefix = Path(repo).resolve(), Path(directory).as_posix().strip("/")
    listing = _git(root, "ls-tree", "-r", "-l", "-z", commit, "--", prefix)
    blobs = {}
    for entry in filter(None, listing.split("\0")):
        meta, _, name = entry.partition("\t")
        mode, kind, blob, size = meta.split()
        small = max_bytes is None or (size.isdigit() and int(size) <= max_bytes)
        if kind == "blob" and mode.startswith("100") and small and name.endswith(suffix) and (recursive or "/" not in name[len(prefix) + 1 :]):
            blobs[name] = blob
    return {root / name: text for name, text in zip(blobs, _blob_texts(root, list(blobs.values())), strict=True)}


def changed_at(repo: str | Path, old: str, new: str, directory: str) -> set[Path]:
    """The files directly in `directory` (a path inside `repo`) that `new` adds or changes (content or type) since `old`
    (renamed ones count as added), as absolute paths under `repo`."""
    root = Path(repo).resolve()
    prefix = directory.strip("/")
    names = _git_raw(root, "diff", "--name-only", "--no-renames", "--diff-filter=AMT", "-z", old, new, "--", prefix).split("\0")
    return {root / name for name in names if name and "/" not in name[len(prefix) + 1 :]}


def _blob_texts(root: Path, blobs: list[str]) -> list[str]:
    """The texts (UTF-8) of git blobs, read by one `git cat-file --batch` rather than a process each."""
    if not blobs:
        return []
    out = subprocess.run(["git", "cat-file", "--batch"], cwd=root, input="".join(f"{blob}\n" for blob in blobs).encode(),
                         capture_output=True, check=True, timeout=60).stdout
    texts, at = [], 0
    for blob in blobs:
        end = out.index(b"\n", at)
        header = out[at:end].decode().split()  # <sha> blob <size>, or <sha> missing
        if len(header) != 3 or header[1] != "blob":
            raise ValueError(f"git has no blob {blob} ({' '.join(header[1:])})")
        size = int(header[2])
        texts.append(out[end + 1 : end + 1 + size].decode())
        at = end + 1 + size + 1  # the blob, then a newline
    return texts
