"""`factory check`: everything that can be known wrong about experiment files before any training."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from factory.config import Experiment, load_file
from factory.config.loader import DEFAULT_MAX_VARIANTS
from factory.errors import ConfigError
from factory.evals.benchmarks import BENCHMARKS


@dataclass(frozen=True, kw_only=True, slots=True)
class FileReport:
    """The verdict on one file."""

    path: str
    experiments: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return {**asdict(self), "ok": self.ok}


def experiment_files(paths: Iterable[Path]) -> list[Path]:
    """The .md files named, or held by the directories named."""
    return [f for p in paths for f in (sorted(p.glob("*.md")) if p.is_dir() else [p])]


def check_files(files: Iterable[Path], max_variants: int = DEFAULT_MAX_VARIANTS) -> list[FileReport]:
    """Check every file; names must be unique across all of them."""
    reports, owners = [], {}
    for path in files:
        try:
            variants = load_file(path, max_variants=max_variants)
        except ConfigError as e:
            reports.append(FileReport(path=str(path), errors=str(e).splitlines()))
            continue
        errors = [error for experiment in variants for error in _semantic_errors(path, experiment)]
        for experiment in variants:
            owner = owners.setdefault(experiment.name, path)
            if owner != path:
                errors.append(f"{path}: experiment name {experiment.name!r} is also defined by {owner}; give each a distinct name")
        reports.append(FileReport(path=str(path), experiments=[v.name for v in variants], errors=errors))
    return reports


def _semantic_errors(path: Path, experiment: Experiment) -> list[str]:
    errors = []
    if experiment.eval is not None:
        for name in experiment.eval.benchmarks:
            if name not in BENCHMARKS:
                errors.append(f"{path}: eval.benchmarks: unknown benchmark {name!r}; registered: {', '.join(sorted(BENCHMARKS))}")
    if experiment.eval is not None and experiment.pretrain is None:
        errors.append(f"{path}: eval: there is no pretrain section, so there is no model to evaluate")
    return errors
