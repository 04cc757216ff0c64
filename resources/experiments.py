"""The experiments directory as a resource: partition key (experiment name) -> typed Experiment."""

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from dagster import ConfigurableResource, Failure, get_dagster_logger

from factory.config import Experiment, load_text
from factory.config.loader import reader
from factory.config.files import MAX_FILE_BYTES, read_text
from factory.errors import ConfigError
from factory.registry.provenance import changed_at, files_at_commit, repo_root
from factory.registry.remote import fetch_branch, is_ancestor

REMOTE_ENV, BRANCH_ENV, RUN_EXISTING_ENV = "FACTORY_GIT_REMOTE", "FACTORY_GIT_BRANCH", "FACTORY_SENSOR_RUN_EXISTING"


class ExperimentFiles(ConfigurableResource):
    """Markdown experiment files in one directory, read from the working tree or from a git commit."""

    directory: str = "experiments"
    # Empty fields fall back to the environment: $FACTORY_GIT_REMOTE, $FACTORY_GIT_BRANCH (default main),
    # $FACTORY_ROOT/sensor-clone, $FACTORY_SENSOR_RUN_EXISTING=1.
    remote: str = ""  # a git URL or path to follow; empty: the local checkout's HEAD
    branch: str = ""  # the remote's branch to follow
    clone: str = ""  # the sensor's own bare clone of the remote
    run_existing: bool = False  # a new sensor's first tick runs the files already there, instead of starting after them

    def remote_url(self) -> str | None:
        """The git remote followed, or None for the local checkout."""
        return self.remote or os.environ.get(REMOTE_ENV) or None

    def branch_name(self) -> str:
        """The remote's branch followed."""
        return self.branch or os.environ.get(BRANCH_ENV) or "main"

    def clone_dir(self) -> Path:
        """Where the remote is fetched to (a bare repository under the factory root)."""
        return Path(self.clone or Path(os.environ.get("FACTORY_ROOT", ".factory")) / "sensor-clone")

    def runs_existing(self) -> bool:
        """Whether a new sensor runs the files already at the commit it starts from."""
        return self.run_existing or os.environ.get(RUN_EXISTING_ENV, "") == "1"

    def fetch(self) -> str:
        """Fetch the followed branch into the clone; its commit (RemoteError when the remote cannot be fetched)."""
        remote = self.remote_url()
        assert remote is not None, "fetch() follows a remote"
        return fetch_branch(remote, self.branch_name(), self.clone_dir())

    def texts(self, commit: str | None = None) -> dict[Path, str]:
        """{path: text} of every experiment file, at `commit` or in the working tree."""
        if commit is None:
            texts, unreadable = self.readable_texts()
            for problem in unreadable:
                get_dagster_logger().warning(f"skipped, cannot be read: {problem}")
            return texts
        try:
            repo, inside = self._in_repository()
            return files_at_commit(inside, commit, max_bytes=MAX_FILE_BYTES, repo=repo)
        except (OSError, ValueError, subprocess.CalledProcessError) as e:
            raise Failure(description=f"cannot read {self.directory} at commit {commit}: {e}") from e

    def changed(self, old: str, new: str, texts: dict[Path, str]) -> set[Path] | None:
        """The experiment files `new` adds or changes since `old` (paths as `texts`, the files at `new`, gives them), and
        those that name one of them (`extends: base.md`, a `from:` file), named or not yet: a file that did not load for
        want of another loads once it comes. None when `old` is not in `new`'s history (a rewritten branch, an unknown
        commit): then every file counts as changed."""
        try:
            repo, inside = self._in_repository()
            if not is_ancestor(repo, old, new):
                return None
            changed = changed_at(repo, old, new, inside)
        except (OSError, ValueError, subprocess.CalledProcessError) as e:
            raise Failure(description=f"cannot compare {self.directory} at commits {old[:12]} and {new[:12]}: {e}") from e
        names = {path.name for path in changed}
        while names:  # what names a changed file is read again, and then what names that one
            more = {path for path, text in texts.items() if path not in changed and any(name in text for name in names)}
            changed |= more
            names = {path.name for path in more}
        return changed

    def _in_repository(self) -> tuple[Path, str]:
        """(the followed remote's clone, or the repository of the working tree; the directory's path in it)."""
        if self.remote_url():
            # in the remote's repository: a relative directory as written, an absolute one by its last name
            return self.clone_dir(), Path(self.directory).name if Path(self.directory).is_absolute() else self.directory
        root = repo_root(self.directory)
        return root, Path(self.directory).resolve().relative_to(root.resolve()).as_posix()

    def readable_texts(self) -> tuple[dict[Path, str], list[str]]:
        """({path: text} of the working tree's experiment files that can be read, why each other one cannot): a FIFO,
        a device or an oversized file among them is skipped unopened, never waited on."""
        texts, unreadable = {}, []
        for path in sorted(Path(self.directory).glob("*.md")):
            try:
                texts[path] = read_text(path)
            except ConfigError as e:
                unreadable.append(str(e))
        return texts, unreadable

    def reader(self, commit: str | None) -> Callable[[Path], str] | None:
        """What reads the files another file names (`extends`, `from`) as this one was read: at `commit`, or (None) from disk."""
        return reader(self.texts(commit)) if commit else None

    def load(self, name: str, commit: str | None = None) -> Experiment:
        """The experiment (or sweep variant) named `name`; a clear Dagster Failure when missing or malformed."""
        texts, broken = self.readable_texts() if commit is None else (self.texts(commit), [])
        found = []
        for path, text in texts.items():
            try:
                variants = load_text(path, text, read=reader(texts) if commit else None)  # one bad file never blocks another
            except ConfigError as e:
                broken.append(str(e))
                continue
            found += [experiment for experiment in variants if experiment.name == name]
        if len(found) > 1:
            files = ", ".join(e.source for e in found)
            raise Failure(description=f"experiment name {name!r} is defined by several files ({files}); give each a distinct name")
        if found:
            return found[0]
        where = f"{self.directory} at commit {commit[:12]}" if commit else str(Path(self.directory).resolve())
        detail = ("\nfiles that did not load:\n" + "\n".join(broken)) if broken else ""
        raise Failure(description=f"no experiment named {name!r} in {where}: add it or remove the partition{detail}")
