"""`factory registry verify | gc`: the registry's damaged manifests and artifacts; the artifacts nothing needs any more."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from factory.cli.common import RootOption, err, hint, out, settings_of
from factory.config import Experiment, load_text
from factory.config.files import read_text
from factory.config.front_matter import parse_yaml, split_front_matter
from factory.config.loader import reader
from factory.errors import ConfigError
from factory.registry import open_registry
from factory.registry.provenance import files_at_commit, head_commit

EXPERIMENTS_ENV = "FACTORY_EXPERIMENTS"
"""The directory of experiment files the sensor reads (as `assets.definitions` reads it)."""
DEFAULT_MIN_AGE_HOURS = 24.0
"""`factory registry gc --min-age-hours` when not given (`factory.ops.gc.MIN_AGE_S`)."""

registry_app = typer.Typer(no_args_is_help=True, help="The artifact registry: manifests and published artifacts.")


@registry_app.command("verify")
def registry_verify(
    root: RootOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for machines.")] = False,
) -> None:
    """Read every manifest and every byte of the artifacts they name; list what is damaged (exit 1), or say all is intact."""
    store = open_registry(settings_of(None, root).root / "registry")
    damaged = store.verify()
    if as_json:
        out.print_json(json.dumps({"registry": store.location, "damaged": [d.to_json() for d in damaged]}))
    elif damaged:
        for damage in damaged:
            out.print(f"{damage.kind} {damage.path}: {damage.problem}", markup=False, highlight=False)
        out.print(f"{len(damaged)} damaged in {store.location}; rerun their stages to publish them again",
                  markup=False, highlight=False)
    else:
        out.print(f"registry {store.location}: every manifest and artifact intact", markup=False, highlight=False)
    if damaged:
        raise typer.Exit(1)


@registry_app.command("gc")
def registry_gc(
    paths: Annotated[list[Path] | None, typer.Argument(
        help="The experiment files or directories whose artifacts to keep (default: the repository's experiments directory, "
             "at git HEAD and as checked out).")] = None,
    root: RootOption = None,
    delete: Annotated[bool, typer.Option("--delete", help="Remove the garbage (without it: a dry run that lists it).")] = False,
    min_age_hours: Annotated[float, typer.Option(
        "--min-age-hours", min=0, help="Keep whatever was published less than this long ago.")] = DEFAULT_MIN_AGE_HOURS,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for machines.")] = False,
) -> None:
    """Remove the artifacts no experiment at HEAD, no alias or ref, no stage computing now and nothing they were made
    from needs; list them first (the default), remove them with --delete."""
    from factory.ops.gc import collect, plan_collection  # the leaderboard's code: only for this command
    settings = settings_of(paths[0] if paths else None, root)
    experiments, broken = kept_experiments(paths or [settings.repository / os.environ.get(EXPERIMENTS_ENV, "experiments")])
    store = open_registry(settings.root / "registry")
    rows = store.rows() if broken else None  # read once: gc walks the same rows
    made_for = {row.experiment for row in rows or ()}
    unmade = [(problem, name) for problem, name in broken if name is not None and not any(name in made for made in made_for)]
    if refused := [problem for problem, name in broken if (problem, name) not in unmade]:
        for problem in refused:
            err.print(problem, markup=False, highlight=False)
        err.print("gc keeps what every experiment needs, so every one must load: fix these files, or name the experiment "
                  "files to keep", markup=False, highlight=False)
        raise typer.Exit(2)
    for problem, name in unmade:  # never run here: nothing was made for it, so there is nothing of it to keep
        err.print(f"note: {problem}\n  nothing in {store.location} was made for {name!r}: gc keeps nothing for it",
                  markup=False, highlight=False)
    try:
        collection = plan_collection(store, experiments, min_age_s=min_age_hours * 3600, rows=rows)
    except ConfigError as e:  # a `from:` that names nothing any more
        err.print(f"{e}\ngc cannot tell what that experiment needs; fix it first", markup=False, highlight=False)
        raise typer.Exit(2) from None
    removal = collect(store, collection) if delete else None
    if as_json:
        shown = collection.to_json() | {"registry": store.location}
        if removal is not None:
            shown |= {"removed": [m.digest for m in removal.removed], "removed_work": removal.work, "freed": removal.bytes,
                      "in_use": [{"digest": m.digest, "why": why} for m, why in removal.in_use]
                      + [{"work": fingerprint, "why": why} for fingerprint, why in removal.work_in_use]}
        out.print_json(json.dumps(shown))
        return
    for manifest in collection.garbage:
        out.print(f"{manifest.kind:<18} {manifest.digest[:12]}  {manifest.experiment:<24} {manifest.created}  "
                  f"{_size(manifest.size)}", markup=False, highlight=False)
    for fingerprint, size in sorted(collection.work.items()):
        out.print(f"{'work directory':<18} {fingerprint[:12]}  {'(a stage no experiment plans)':<24} {'':<25}  {_size(size)}",
                  markup=False, highlight=False)
    work = f" and {len(collection.work)} work directories" if collection.work else ""
    if removal is None:
        kept_young = [] if min_age_hours == DEFAULT_MIN_AGE_HOURS else ["--min-age-hours", f"{min_age_hours:g}"]  # the same garbage
        out.print(f"{len(collection.garbage)} artifacts{work} ({_size(collection.bytes)}) in {store.location} are needed by nothing; "
                  f"{len(collection.keep)} kept. Remove them: {hint(settings, 'registry', 'gc', *map(str, paths or []), *kept_young, '--delete')}",
                  markup=False, highlight=False)
        return
    for manifest, why in removal.in_use:
        out.print(f"left {manifest.kind} {manifest.digest[:12]}: {why}", markup=False, highlight=False)
    for fingerprint, why in removal.work_in_use:
        out.print(f"left the work directory of {fingerprint[:12]}: {why}", markup=False, highlight=False)
    removed = f" and {len(removal.work)} work directories" if removal.work else ""
    out.print(f"removed {len(removal.removed)} artifacts{removed} ({_size(removal.bytes)}) from {store.location}", markup=False, highlight=False)


def kept_experiments(paths: list[Path]) -> tuple[list[Experiment], list[tuple[str, str | None]]]:
    """The experiments of the files named and of the Markdown files with front matter under the directories named (at git
    HEAD too), and why each such file that does not load fails, with the name its experiments have (None: unknown)."""
    experiments: list[Experiment] = []
    broken: list[tuple[str, str | None]] = []

    def load(file: Path, text: str | None, read: Callable[[Path], str] | None, where: str = "") -> None:
        try:
            if text is None:
                text = read_text(file)
            if text.startswith("---"):  # front matter: an experiment (a README beside them is not)
                experiments.extend(load_text(file, text, read=read))
        except ConfigError as e:
            broken.append((f"{where}{e}", _named(file, text)))

    for path in paths:
        if not path.exists():
            broken.append((f"{path}: no such file or directory", None))
        elif not path.is_dir():
            load(path, None, None)
            continue
        if (commit := head_commit(path)) is not None:
            texts = files_at_commit(path, commit, recursive=True)
            for file, text in texts.items():
                load(file, text, reader(texts), "at HEAD: ")
        for file in sorted(path.rglob("*.md")):
            load(file, None, None)
    return experiments, broken


def _named(file: Path, text: str | None) -> str | None:
    """The name of the experiments of a file that does not load (its `name:`, else its stem; a sweep's variants start with
    it), or None when its front matter does not even parse."""
    try:
        front, first_line, _ = split_front_matter(file, text or "")
        parsed, _ = parse_yaml(file, front, first_line)
    except ConfigError:
        return None
    name = parsed.get("name", file.stem) if isinstance(parsed, dict) else None
    return name if isinstance(name, str) and name else None


def _size(count: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"
