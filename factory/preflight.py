"""`factory check`: everything that can be known wrong about experiment files before any training.

Light to import (a check of one file takes well under a second): the catalog's code is imported
only when a file pins a table version.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from factory.config import Experiment, load_file
from factory.config.cluster import ClusterProfile, queue_problems
from factory.config.files import outside_roots
from factory.config.settings import data_roots
from factory.config.kinds import chain_ends_twice, computed_datasets, dataset_needs, exported, stage_kind, stage_kinds, trains
from factory.config.loader import DEFAULT_MAX_VARIANTS, Location, key_locations, location_of
from factory.config.source_kinds import source_kind
from factory.config.sources import source_problems
from factory.dataset_names import DatasetOwners
from factory.errors import ConfigError
from factory.evals.benchmarks import benchmark, known, registered
from factory.evals.custom import NAME as CUSTOM

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

    from factory.registry import Registry

Resolver = Callable[[Experiment], object]
"""Resolves an experiment's `from`, raising a located ConfigError when it cannot."""
Problem = tuple[tuple, str]
"""The keys of the field at fault and what is wrong with it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FileReport:
    """The verdict on one file."""

    path: str
    experiments: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """What runs but is probably not what was meant (a blend part of weight 0 is still ingested); never fails a check."""

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
    cluster: ClusterProfile | None = None, bases: Resolver | None = None, registry: Registry | None = None,
) -> list[FileReport]:
    """Check every file; names must be unique across all of them. Pinned `table@tag`s are looked up in
    `catalog` (opened only when some file pins one; each reference checked once). With a `cluster`
    profile, placements must fit its queues and images must be pinned for a cluster launcher. `bases` resolves a
    file's `from` (`factory.ops.bases.resolve` against the registry): what it cannot resolve is an error. A dataset name
    that another experiment of the repository (or of the `registry`'s raw stages) gives another source is a warning."""
    reports, owners = [], {}
    datasets = DatasetOwners(registry)
    tables = TableLookup(catalog) if catalog is not None else None
    for path in files:
        try:
            variants = load_file(path, max_variants=max_variants)
        except ConfigError as e:
            reports.append(FileReport(path=str(path), errors=str(e).splitlines()))
            continue
        errors = check_variants(path, variants, tables, cluster, bases=bases)
        for experiment in variants:
            owner = owners.setdefault(experiment.name, path)
            if owner != path:
                errors.append(f"{path}: experiment name {experiment.name!r} is also defined by {owner}; give each a distinct name")
        found = [warning for experiment in variants for warning in _warnings(path, experiment)]
        found += _located(path, datasets.conflicts(path, variants), lambda: key_locations(path))
        warnings = list(dict.fromkeys(found))
        reports.append(FileReport(path=str(path), experiments=[v.name for v in variants], errors=errors, warnings=warnings))
    return reports


def check_variants(
    path: Path, variants: list[Experiment], tables: TableLookup | None = None, cluster: ClusterProfile | None = None,
    locations: Callable[[], dict[tuple, Location]] | None = None, bases: Resolver | None = None,
) -> list[str]:
    """Every error `factory check` knows for the variants of one file, each as `file:line: field: message`.

    `locations` gives where each key was written (default: read from `path`; the sensor passes the file at a commit);
    `bases` resolves each variant's `from` (its errors are located already)."""
    where = locations or (lambda: key_locations(path))
    roots = data_roots(path.parent)
    found = [problem for experiment in variants for problem in _semantic_problems(experiment, roots)]
    found += [problem for experiment in variants for problem in _control_problems(experiment)]
    if cluster is not None:
        found += [problem for experiment in variants for problem in _placement_problems(experiment, cluster)]
    if tables is not None:
        found += _table_problems(variants, tables)
    errors = _located(path, list(dict.fromkeys(found)), where)
    return errors + list(dict.fromkeys(problem for experiment in variants for problem in _base_problems(experiment, bases)))


def _base_problems(experiment: Experiment, bases: Resolver | None) -> list[str]:
    """Why the experiment's `from` cannot be resolved (empty when it can, or without a resolver)."""
    if bases is None or experiment.base is None:
        return []
    try:
        bases(experiment)
    except ConfigError as e:
        return str(e).splitlines()
    return []


class TableLookup:
    """Answers whether pinned table versions exist; opens the catalog on first use and asks once per reference."""

    def __init__(self, open_catalog: Callable[[], Catalog]) -> None:
        self._open = open_catalog
        self._catalog: Catalog | None = None
        self._answers: dict[str, list[str]] = {}

    def problems(self, ref: str, columns: tuple[str, ...] = ()) -> list[str]:
        """Why `ref` cannot be read as a version with `columns` (empty when it can)."""
        if (ref, columns) not in self._answers:
            from factory.data.tables import version_problems

            if self._catalog is None:
                self._catalog = self._open()
            self._answers[(ref, columns)] = version_problems(self._catalog, ref, columns)
        return self._answers[(ref, columns)]


def _table_problems(variants: list[Experiment], tables: TableLookup) -> list[Problem]:
    """Pinned table versions the catalog does not hold, or holds without the columns their reader needs."""
    found: list[Problem] = []
    for experiment in variants:
        for index, part in enumerate(experiment.data.blend):
            if part.table:
                from factory.data.documents import COLUMNS  # pyarrow: only for a file that pins a table

                found += [(("data", "blend", index, "table"), problem) for problem in tables.problems(part.table, COLUMNS)]
        # The pinned tables each stage kind it runs reads (post-training's task sets, a plugin's tables).
        for kind in stage_kinds():
            if kind.tables is not None and kind.runs_in(experiment):
                found += [(need.where, problem) for need in kind.tables(experiment) for problem in tables.problems(need.table, need.columns)]
    # Prompts saved from Podium, evaluated as `custom_prompts.v<n>`: that version must exist.
    tags = dict.fromkeys(m.group(1) for e in variants if e.eval for b in e.eval.benchmarks if (m := CUSTOM.fullmatch(b)))
    if tags:
        from factory.data.prompts import TABLE as PROMPTS

        found += [(("eval", "benchmarks"), problem) for tag in tags for problem in tables.problems(f"{PROMPTS}@{tag}")]
    return found


def _semantic_problems(experiment: Experiment, roots: tuple[Path, ...]) -> list[Problem]:
    found: list[Problem] = []
    for name, dataset in experiment.data.datasets.items():
        source = dataset.source
        found += [(("data", "datasets", name, "source", *keys), problem) for keys, problem in source_problems(source, roots)]
        if not source_kind(source.kind).takes_path:
            continue
        keys = ("data", "datasets", name, "source", "path")
        if refused := outside_roots(Path(source.path or ""), roots):  # before any stat: /proc, /dev and others are not data
            found.append((keys, f"{refused}; point it at a directory of data"))
        elif not Path(source.path or "").is_dir():
            found.append((keys, f"{source.path!r} is not a directory here"))
    found += _dataset_problems(experiment)
    found += _training_problems(experiment)
    if experiment.eval is not None:
        for name in experiment.eval.benchmarks:
            if not known(name):
                found.append((("eval", "benchmarks"), f"unknown benchmark {name!r}; registered: {', '.join(sorted(registered()))}"))
            elif missing := benchmark(name).missing:
                found.append((("eval", "benchmarks"), f"benchmark {name!r} needs the package {', '.join(missing)}, which is not installed "
                                                      f"here: pip install {' '.join(missing)}"))
    if experiment.eval is not None and not trains(experiment):
        training = ", ".join(kind.section or kind.name for kind in stage_kinds() if kind.checkpoints)
        found.append((("eval",), f"no stage of this file trains (a section of {training}), so there are no checkpoints to "
                                 "evaluate; add one or remove eval"))
    found += _imported_template_problems(experiment)
    return found


def _imported_template_problems(experiment: Experiment) -> list[Problem]:
    """SFT on `sft.data` without its own template renders with the chat template of the checkpoint `model.from_hf` names:
    the factory must be able to render it."""
    data = experiment.sft.data if experiment.sft is not None else None
    source = experiment.model.from_hf
    if data is None or data.chat_template is not None or source is None:
        return []
    from factory.config.hf_checkpoint import read_checkpoint

    checkpoint = read_checkpoint(source.path)
    if problem := checkpoint.chat_template_problem(data.format):
        return [(("sft", "data"), f"the rows would be rendered with the chat template of {checkpoint.chat_template_source}, but {problem}; "
                                  "set sft.data.chat_template to one that renders them")]
    return []


def _training_problems(experiment: Experiment) -> list[Problem]:
    """What the file's training kinds start from, and which one the model stage exports: each declared by the kinds."""
    found: list[Problem] = []
    running = [kind for kind in stage_kinds() if kind.checkpoints and kind.runs_in(experiment)]
    for index, kind in enumerate(running):
        if kind.training is None or kind.section is None:
            continue
        written = getattr(getattr(experiment, kind.section), "from_", None)
        before = [k.section or k.name for k in running[:index] if k.name in kind.reads]
        if written is not None and before:
            found.append(((kind.section, "from"), f"the file trains {' and '.join(before)} before {kind.name}, which starts from "
                                                  f"there; remove '{kind.section}.from' (or those sections)"))
        elif (written is None and not before and kind.training.starts_from_model and experiment.model.from_hf is None
              and experiment.base is None):
            starts = ", ".join(name for name in kind.reads if stage_kind(name).checkpoints)
            found.append(((kind.section,), f"{kind.name} trains a model made before it: add a section it starts from ({starts}), "
                                           f"start from a checkpoint with 'model.from_hf', or from a model made elsewhere with "
                                           f"'{kind.section}.from'"))
    names = [kind.name for kind in running]
    if experiment.export is not None and experiment.export not in names:
        found.append((("export",), f"{experiment.export!r} is no training stage of this file (they are: {', '.join(names) or 'none'}); "
                                   "name one of them"))
    elif experiment.export is None and len(last := exported(names)) > 1:
        found.append(((stage_kind(last[-1]).section or last[-1],), chain_ends_twice(last)))
    return found


def _dataset_problems(experiment: Experiment) -> list[Problem]:
    """Each dataset a stage reads (`sft.data.dataset`, a plugin's) must be a dataset of the file whose source keeps the
    columns the stage needs."""
    found: list[Problem] = []
    for need in dataset_needs(experiment):
        dataset = experiment.data.datasets.get(need.dataset)
        if dataset is None:
            found.append((need.where, f"names no dataset of this file ({need.dataset!r}; its datasets: "
                                      f"{', '.join(experiment.data.datasets) or 'none'}); define it under data.datasets"))
        elif missing := [name for name in need.columns if name not in dataset.source.columns]:
            found.append((need.where, f"dataset {need.dataset!r} keeps no column {', '.join(map(repr, missing))} (its source.columns: "
                                      f"{', '.join(dataset.source.columns) or 'none'}); add them to "
                                      f"data.datasets.{need.dataset}.source.columns"))
    return found


def _warnings(path: Path, experiment: Experiment) -> list[str]:
    """Settings that run but probably do not do what was meant, as `file:line: field: message`."""
    found: list[Problem] = []
    for index, part in enumerate(experiment.data.blend):
        if part.weight == 0 and part.dataset is not None:
            found.append((("data", "blend", index, "weight"), f"weight 0: dataset {part.dataset!r} is still ingested, deduplicated and "
                                                              "filtered, but training never draws from it; remove the part or give it a weight"))
    read = computed_datasets(experiment)
    for name in experiment.data.datasets:
        if name not in read:
            found.append((("data", "datasets", name), f"dataset {name!r} is not in data.blend: no stage reads it, so it is not ingested; "
                                                      "add it to the blend to train on it"))
    return _located(path, found, lambda: key_locations(path))


def _placement_problems(experiment: Experiment, cluster: ClusterProfile) -> list[Problem]:
    """Whether the experiment can run where the profile says stages run."""
    found: list[Problem] = []
    if experiment.image == "local" and cluster.launcher != "local":
        found.append((("image",), f"'local' runs only with the local launcher; the {cluster.launcher} launcher needs an image pinned "
                                  "by digest (name@sha256:<64 hex>)"))
    wanted = experiment.resources
    found += [(("resources", field), message) for field, message in queue_problems(cluster, wanted.queue, wanted.nodes, wanted.gpus, wanted.priority)]
    if cluster.launcher == "local" and wanted.nodes > 1:
        found.append((("resources", "nodes"), f"{wanted.nodes} nodes, but the local launcher runs a stage on one machine"))
    return found


def _located(path: Path, found: list[Problem], locations: Callable[[], dict[tuple, Location]]) -> list[str]:
    """`file:line: dotted.field: message` for each problem, at the deepest key written on the way to its field."""
    if not found:
        return []
    written = locations()
    errors = []
    for keys, message in found:
        where, line = location_of(keys, written, (path, 1))
        errors.append(f"{where}:{line}: {'.'.join(str(k) for k in keys)}: {message}")
    return errors


def _control_problems(experiment: Experiment) -> list[Problem]:
    """The control section's rules, metrics and operations, checked as the training loop will build them."""
    if experiment.control is None:
        return []
    from factory.train.control import problems as control_problems  # the controller's code: only for a file with rules

    found = control_problems(experiment.control, experiment.pretrain.steps if experiment.pretrain is not None else None)
    if experiment.pretrain is None:
        found.insert(0, (("control",), "rules run inside pretraining, but there is no pretrain section"))
    return found
