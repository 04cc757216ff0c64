"""The experiments directory as a resource: partition key (experiment name) -> typed Experiment."""

from __future__ import annotations

from pathlib import Path

from dagster import ConfigurableResource, Failure

from factory.config import Experiment, load
from factory.errors import ConfigError


class ExperimentFiles(ConfigurableResource):
    """Markdown experiment files in one directory."""

    directory: str = "experiments"

    def paths(self) -> list[Path]:
        """Every experiment file, in name order."""
        return sorted(Path(self.directory).glob("*.md"))

    def load(self, name: str) -> Experiment:
        """The experiment whose name is `name`; a clear Dagster Failure when it is missing or malformed."""
        candidates = [Path(self.directory) / f"{name}.md", *self.paths()]
        for path in dict.fromkeys(candidates):
            if not path.exists():
                continue
            try:
                experiment = load(path)
            except ConfigError as e:
                if path.stem == name:
                    raise Failure(description=str(e)) from e
                continue
            if experiment.name == name:
                return experiment
        raise Failure(description=f"no experiment named {name!r} in {Path(self.directory).resolve()}: add {name}.md there or remove the partition")
