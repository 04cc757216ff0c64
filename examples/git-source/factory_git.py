"""The `git` source kind: the files of one commit of a local git repository.

    source: {kind: git, repo: data/corpus, commit: 3f2a9c1, include: ["**/*.py"]}

`repo` names the repository (its working tree or its `.git` directory), under the data roots like a `directory`
source's path; `commit` the commit, by its sha, full or abbreviated. `factory check` resolves the commit and refuses a
missing repository or a commit it does not hold, saying what to change. The raw stage reads the commit's tree as
`git archive` writes it, unpacked once into the factory's bounded source cache under the full sha: a branch that moves,
or an edit of the working tree, never changes what a pinned commit reads. A link in the tree that leads out of it is
left out.

Everything the factory needs is in `GIT` below; the package's `model_factory.sources` entry point names it. Of the
factory, only `factory.plugin` is imported.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import IO

from pydantic import Field

from factory.plugin import ConfigError, DataPath, Section, SourceConfig, SourceKind, source_cache

GIT_TIMEOUT_S = 60
"""The longest a question to git (which commit a sha names) may take."""
ARCHIVE_TIMEOUT_S = 1800
"""The longest writing a commit's tree may take."""


class GitFields(Section):
    """The commit a `git` source reads."""

    repo: DataPath
    """A local git repository (its working tree or its `.git` directory), absolute or relative to the working directory,
    under the data roots."""
    commit: str = Field(pattern=r"^[0-9a-fA-F]{4,64}$")
    """The commit to read, by its sha: full, or abbreviated to at least 4 hex digits (quote one of digits only). Not a
    branch or a tag, which move: a pinned commit reads the same files forever."""


def resolve(fields: GitFields) -> str:
    """The full sha of the commit `fields` names; a ConfigError saying what to change when there is none."""
    repo = Path(fields.repo)
    if not repo.is_dir():
        raise ConfigError(f"repo: {fields.repo!r} is not a directory here; point repo at a local git repository "
                          "(relative paths start at the working directory)")
    answer = _git(repo, "rev-parse", "--verify", "--end-of-options", f"{fields.commit}^{{commit}}", timeout=GIT_TIMEOUT_S)
    if answer.returncode == 0:
        return answer.stdout.decode().strip()
    said = answer.stderr.decode(errors="replace").strip().splitlines()
    if _git(repo, "rev-parse", "--git-dir", timeout=GIT_TIMEOUT_S).returncode != 0:
        raise ConfigError(f"repo: {repo} is not a git repository git can read ({said[-1] if said else 'git said nothing'}); "
                          "point repo at the working tree of a repository or its .git directory")
    if any("ambiguous" in line for line in said):
        raise ConfigError(f"commit: {fields.commit!r} abbreviates more than one object of {repo}; give more of its digits")
    raise ConfigError(f"commit: {fields.commit!r} is no commit of {repo}; give the sha of one of its commits "
                      f"(git -C {repo} log --oneline)")


def check(fields: GitFields) -> None:
    """Refuse a repository that is missing or a commit it does not hold."""
    resolve(fields)


def root(source: SourceConfig) -> Path:
    """The commit's tree, unpacked into the source cache under its full sha (once: a commit never changes)."""
    fields = source.fields
    assert isinstance(fields, GitFields), "the factory validates a git source's fields with GitFields"
    sha = resolve(fields)
    return source_cache("git", sha, lambda directory: unpack(Path(fields.repo), sha, directory))


def unpack(repo: Path, sha: str, directory: Path) -> None:
    """Write the tree of commit `sha` into `directory`, as `git archive` gives it; links leading out of it are left out."""
    with tempfile.TemporaryFile() as archive:
        written = _git(repo, "archive", "--format=tar", sha, timeout=ARCHIVE_TIMEOUT_S, stdout=archive)
        if written.returncode != 0:
            said = written.stderr.decode(errors="replace").strip()
            raise ConfigError(f"repo: git archive of commit {sha} of {repo} failed ({said or 'git said nothing'}); check the "
                              "repository with git fsck")
        archive.seek(0)
        with tarfile.open(fileobj=archive, mode="r:") as tar:
            tar.extractall(directory, filter=_inside)


def _inside(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """A member as tarfile's `data` filter keeps it, or None (left out) for one it refuses (a link out of the tree)."""
    try:
        return tarfile.data_filter(member, path)
    except tarfile.FilterError:
        return None


def _git(repo: Path, *args: str, timeout: float, stdout: int | IO[bytes] = subprocess.PIPE) -> subprocess.CompletedProcess[bytes]:
    """Run `git -C repo ARGS` without a shell: in that repository only (never one above it), the caller's GIT_*
    variables left out, never asking for a password. A ConfigError when git is missing or does not answer in time."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env |= {"GIT_TERMINAL_PROMPT": "0", "GIT_CEILING_DIRECTORIES": str(repo.resolve().parent)}
    try:
        return subprocess.run(["git", "-C", str(repo), *args], stdout=stdout, stderr=subprocess.PIPE, env=env, timeout=timeout,
                              check=False)
    except FileNotFoundError as e:
        raise ConfigError("git is not installed here: install git to read a `git` source") from e
    except subprocess.TimeoutExpired as e:
        raise ConfigError(f"repo: git did not answer within {timeout:g}s in {repo}; check the repository") from e


GIT = SourceKind(
    name="git", description="the files of one commit of a local git repository (`repo`, `commit`)", root=root,
    fields=GitFields, check=check,
)
