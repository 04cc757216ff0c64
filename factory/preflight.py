"""`factory check`: everything that can be known wrong about experiment files before any training."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog

from factory.config import Experiment, load_file
from factory.config.cluster import ClusterProfile
from factory.config.loader import DEFAULT_MAX_VARIANTS, key_locations, location_of
from factory.data.tables import missing_refs
from factory.errors import ConfigError
from factory.evals.benchmarks import registered
from factory.train.control import problems as control_problems


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


def check_files(
    files: Iterable[Path], max_variants: int = DEFAULT_MAX_VARIANTS, catalog: Callable[[], Catalog] | None = None,
    cluster: ClusterProfile | None = None,
) -> list[FileReport]:
    """Check every file; names must be unique across all of them. Pinned `table@tag`s are looked up in
    `catalog` (opened only when some file pins one; each reference checked once). With a `cluster`
    profile, placements must fit its queues and images must be pinned for a cluster launcher."""
    reports, owners = [], {}
    tables = TableLookup(catalog) if catalog is not None else None
    for path in files:
        try:
            variants = load_file(path, max_variants=max_variants)
        except ConfigError as e:
            reports.append(FileReport(path=str(path), errors=str(e).splitlines()))
            continue
        errors = [error for experiment in variants for error in _semantic_errors(path, experiment)]
        errors += list(dict.fromkeys(error for experiment in variants for error in _control_errors(path, experiment)))
        if cluster is not None:
            errors += list(dict.fromkeys(error for experiment in variants for error in _placement_errors(path, experiment, cluster)))
        if tables is not None:
            errors += _missing_tables(path, variants, tables)
        for experiment in variants:
            owner = owners.setdefault(experiment.name, path)
            if owner != path:
                errors.append(f"{path}: experiment name {experiment.name!r} is also defined by {owner}; give each a distinct name")
        reports.append(FileReport(path=str(path), experiments=[v.name for v in variants], errors=errors))
    return reports


class TableLookup:
    """Answers whether pinned table versions exist; opens the catalog on first use and asks once per reference."""

    def __init__(self, open_catalog: Callable[[], Catalog]) -> None:
        self._open = open_catalog
        self._catalog: Catalog | None = None
        self._answers: dict[str, list[str]] = {}

    def problems(self, ref: str) -> list[str]:
        """Why `ref` cannot be read (empty when it can)."""
        if ref not in self._answers:
            if self._catalog is None:
                self._catalog = self._open()
            self._answers[ref] = missing_refs(self._catalog, [ref])
        return self._answers[ref]


def _missing_tables(path: Path, variants: list[Experiment], tables: TableLookup) -> list[str]:
    """Errors for pinned table versions the catalog does not hold."""
    refs = dict.fromkeys(part.table for experiment in variants for part in experiment.data.blend if part.table)
    return [f"{path}: data.blend: {problem}" for ref in refs for problem in tables.problems(ref)]


def _semantic_errors(path: Path, experiment: Experiment) -> list[str]:
    errors = []
    for name, dataset in experiment.data.datasets.items():
        source = dataset.source
        if source.kind == "directory" and not Path(source.path or "").is_dir():
            errors.append(f"{path}: data.datasets.{name}.source.path: {source.path!r} is not a directory here")
    if experiment.eval is not None:
        for name in experiment.eval.benchmarks:
            if name not in registered():
                errors.append(f"{path}: eval.benchmarks: unknown benchmark {name!r}; registered: {', '.join(sorted(registered()))}")
    if experiment.eval is not None and experiment.pretrain is None:
        errors.append(f"{path}: eval: there is no pretrain section, so there is no model to evaluate")
    return errors


def _placement_errors(path: Path, experiment: Experiment, cluster: ClusterProfile) -> list[str]:
    """Whether the experiment can run where the profile says stages run; errors name file:line."""
    found: list[tuple[tuple[str, ...], str]] = []
    if experiment.image == "local" and cluster.launcher != "local":
        found.append((("image",), f"'local' runs only with the local launcher; the {cluster.launcher} launcher needs an image pinned "
                                  "by digest (name@sha256:<64 hex>)"))
    wanted = experiment.resources
    queue = cluster.queues.get(wanted.queue)
    if queue is None:
        found.append((("resources", "queue"), f"unknown queue {wanted.queue!r}; the cluster has: {', '.join(sorted(cluster.queues))}"))
    else:
        if wanted.nodes > queue.nodes:
            found.append((("resources", "nodes"), f"{wanted.nodes} nodes, but queue {wanted.queue!r} gives a stage at most {queue.nodes}"))
        if wanted.gpus > queue.gpus_per_node:
            found.append((("resources", "gpus"), f"{wanted.gpus} GPUs per node, but queue {wanted.queue!r} has {queue.gpus_per_node}"))
        if wanted.priority is not None and wanted.priority not in queue.priorities:
            allowed = ", ".join(queue.priorities) or "none"
            found.append((("resources", "priority"), f"priority {wanted.priority!r} is not offered by queue {wanted.queue!r}; offered: {allowed}"))
    if cluster.launcher == "local" and wanted.nodes > 1:
        found.append((("resources", "nodes"), f"{wanted.nodes} nodes, but the local launcher runs a stage on one machine"))
    return _located(path, found)


def _located(path: Path, found: list[tuple[tuple, str]]) -> list[str]:
    """`file:line: dotted.field: message` for each problem, at the deepest key written on the way to its field."""
    if not found:
        return []
    locations = key_locations(path)
    errors = []
    for keys, message in found:
        where, line = location_of(keys, locations, (path, 1))
        errors.append(f"{where}:{line}: {'.'.join(str(k) for k in keys)}: {message}")
    return errors


def _control_errors(path: Path, experiment: Experiment) -> list[str]:
    """The control section's rules, metrics and operations, checked as the training loop will build them; errors name file:line."""
    if experiment.control is None:
        return []
    found = control_problems(experiment.control)
    if experiment.pretrain is None:
        found.insert(0, (("control",), "rules run inside pretraining, but there is no pretrain section"))
    return _located(path, found)
