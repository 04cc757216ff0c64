"""Two experiments, one dataset name: who else writes `raw.<name>`, `dedup.<name>` and `filtered.<name>`.

Tables are named by dataset, not by experiment, so that experiments reading one source share its versions (and the
cache). Two experiments that give one name different sources write into the same tables: every version stays right
and a pin (`raw.notes@v3`) keeps reading what it named, but the tables' newest version, the one Podium shows as
current, is whichever ran last. `factory check` warns of it, naming both, from the other experiment files of the
repository and from the raw stages the registry recorded.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from factory.config import Experiment, load_file
from factory.config.data_sections import SourceConfig
from factory.config.files import MAX_FILE_BYTES, repository_root
from factory.errors import ConfigError
from factory.registry import Registry
from factory.config.kinds import computed_datasets
from factory.stages.datasets import RAW_DATASETS

Problem = tuple[tuple, str]
GIT_TIMEOUT_S = 10


@dataclass(frozen=True, kw_only=True, slots=True)
class Definition:
    """One experiment's source for a dataset name, and where it was found."""

    name: str
    experiment: str
    source: dict
    """The source's settings as JSON (what the raw stage records)."""
    where: str
    """The experiment file, or the registry's record of a run."""


class DatasetOwners:
    """The definitions of every dataset name in the repositories and registry looked at; each is read once, when first needed."""

    def __init__(self, registry: Registry | None = None) -> None:
        self._registry = registry
        self._recorded: list[Definition] | None = None
        self._repositories: dict[Path, list[Definition]] = {}

    def conflicts(self, path: Path, variants: list[Experiment]) -> list[Problem]:
        """A warning for each dataset of `path`'s variants that another experiment defines with another source."""
        ours = {variant.name for variant in variants}
        found: dict[tuple[str, str], str] = {}
        for mine in (d for variant in variants for d in definitions(variant, str(path))):
            for other in self._repository(path) + self._registered():
                if other.name == mine.name and other.experiment not in ours and other.source != mine.source:
                    found.setdefault((mine.name, other.experiment), _message(mine.name, other))
        return [(("data", "datasets", name), message) for (name, _), message in found.items()]

    def _repository(self, path: Path) -> list[Definition]:
        repository = repository_root(path.resolve().parent)
        if repository not in self._repositories:
            self._repositories[repository] = [d for file in experiment_files_in(repository) for d in _file_definitions(file)]
        return self._repositories[repository]

    def _registered(self) -> list[Definition]:
        if self._recorded is None:
            manifests = self._registry.manifests(RAW_DATASETS.name) if self._registry is not None else ()
            self._recorded = [d for manifest in manifests for d in _recorded(manifest.experiment, manifest.config, manifest.digest)]
        return self._recorded


def definitions(experiment: Experiment, where: str) -> list[Definition]:
    """The sources of the datasets `experiment` ingests."""
    data = experiment.data.datasets
    return [Definition(name=name, experiment=experiment.name, source=data[name].source.model_dump(mode="json"), where=where)
            for name in computed_datasets(experiment)]


def experiment_files_in(repository: Path) -> list[Path]:
    """The Markdown files of the repository (git's tracked and untracked, not ignored) that may define datasets."""
    try:
        listed = subprocess.run(["git", "-C", str(repository), "ls-files", "-co", "--exclude-standard", "-z", "--", "*.md"],
                                capture_output=True, timeout=GIT_TIMEOUT_S, check=True).stdout.decode(errors="replace").split("\0")
        files = [repository / name for name in listed if name]
    except (OSError, subprocess.SubprocessError):
        files = sorted(repository.glob("*.md"))
    return [file for file in files if _may_define_datasets(file)]


def _may_define_datasets(file: Path) -> bool:
    """Whether the file is front matter that names datasets or extends a file (read no further than a recipe's size)."""
    try:
        with file.open("rb") as handle:
            head = handle.read(MAX_FILE_BYTES)
    except OSError:
        return False
    return head.startswith(b"---") and (b"datasets:" in head or b"extends:" in head)


def _file_definitions(file: Path) -> list[Definition]:
    """Every variant's dataset definitions in `file`; none for a file that does not load (its own check says why)."""
    try:
        variants = load_file(file)
    except ConfigError:
        return []
    return [d for variant in variants for d in definitions(variant, str(file))]


def _recorded(experiment: str, config: Mapping[str, Any], digest: str) -> list[Definition]:
    """The sources a raw stage recorded (its config's `sources`), read as this version reads them; a record it cannot read gives none."""
    found = []
    for name, source in dict(config.get("sources") or {}).items():
        try:
            parsed = SourceConfig.model_validate(source).model_dump(mode="json")
        except ValidationError:
            continue
        found.append(Definition(name=name, experiment=experiment, source=parsed, where=f"recorded in the registry: raw stage {digest[:12]}"))
    return found


def _message(name: str, other: Definition) -> str:
    return (f"dataset {name!r} is also defined, with another source, by experiment {other.experiment!r} ({other.where}): both "
            f"write raw.{name}, dedup.{name} and filtered.{name}, so their newest version (Podium's current one) is whichever "
            f"ran last; pins such as raw.{name}@v3 still read what they named. Give one of them another name, or both the same "
            "source to share the tables on purpose")
