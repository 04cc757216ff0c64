"""`factory check | plan | diff`: look at experiments and artifacts without running anything.

They load no torch, no Kubernetes client and no plotting: each imports what else it needs when it runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.table import Table

from factory.cli.common import ClusterOption, RootOption, err, kubernetes, out, settings_of
from factory.config import Experiment, load_file, pick_variant
from factory.config.cluster import load_profile
from factory.config.loader import DEFAULT_MAX_VARIANTS
from factory.data.catalog import CatalogConfig, open_catalog
from factory.errors import ConfigError
from factory.preflight import check_files, experiment_files
from factory.registry import open_registry
from factory.ops.bases import resolve
from factory.ops.plan import build_plan, counts, describe_placement


def check(
    paths: Annotated[list[Path], typer.Argument(help="Experiment files or directories.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout, for machines.")] = False,
    max_variants: Annotated[int, typer.Option(help="A sweep may expand to at most this many variants.")] = DEFAULT_MAX_VARIANTS,
    root: RootOption = None,
    cluster: Annotated[
        Path | None, typer.Option("--cluster", envvar="FACTORY_CLUSTER", help="A cluster profile: placements must fit its queues.")
    ] = None,
) -> None:
    """Validate experiment files without running anything; exit 2 when any is wrong."""
    files = experiment_files(paths)
    if not files:
        err.print("error: no experiment files given (pass .md files or directories holding them)")
        raise typer.Exit(2)
    try:
        profile = load_profile(cluster) if cluster is not None else None
    except ConfigError as e:
        err.print(str(e), markup=False, highlight=False)
        raise typer.Exit(2) from e
    state = settings_of(files[0], root).root
    registry = open_registry(state / "registry")
    reports = check_files(files, max_variants, catalog=lambda: open_catalog(CatalogConfig.at(state)), cluster=profile,
                          bases=lambda experiment: resolve(experiment, registry), registry=registry)
    if as_json:
        print(json.dumps({"ok": all(r.ok for r in reports), "files": [r.to_json() for r in reports]}, indent=2))
    else:
        for report in reports:
            if report.ok:
                out.print(f"ok  {report.path}  ({', '.join(report.experiments)})", markup=False, highlight=False)
            for error in report.errors:
                err.print(error, markup=False, highlight=False)
            for warning in report.warnings:
                err.print(f"warning: {warning}", markup=False, highlight=False)
    if not all(r.ok for r in reports):
        raise typer.Exit(2)


def plan(
    paths: Annotated[list[Path], typer.Argument(help="Experiment files or directories.")],
    root: RootOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout, for machines.")] = False,
    launcher: Annotated[
        Literal["local", "volcano"], typer.Option(help="volcano: print the Job manifest (YAML) of every stage that would run, after the table.")
    ] = "local",
    cluster: ClusterOption = None,
) -> None:
    """Show, without running anything, which stages are cached, will run (and why), or are waiting."""
    files = experiment_files(paths)
    experiments = []
    for path in files:
        experiments += load_file(path)
    registry = open_registry(settings_of(files[0] if files else None, root).root / "registry")
    plans = build_plan(experiments, registry)
    if launcher == "volcano":
        from factory.launch import volcano  # its manifest rules load a Kubernetes schema: only for --launcher volcano

        try:
            manifests = volcano.dry_run(experiments, kubernetes(cluster), registry)
        except ConfigError as e:
            err.print(str(e), markup=False, highlight=False)
            raise typer.Exit(2) from None
    if as_json:
        print(json.dumps({"stages": [p.to_json() for p in plans], "runs": counts(plans)}, indent=2))
        return
    table = Table(title="plan", title_justify="left")
    for column in ("experiment", "stage", "status", "placement", "detail"):
        table.add_column(column)
    styles = {"cached": "green", "run": "yellow", "waiting": "cyan", "shared": "dim"}
    for p in plans:
        table.add_row(p.experiment, p.kind, f"[{styles[p.status]}]{p.status}[/]", describe_placement(p.placement), p.detail)
    out.print(table)
    out.print("will compute: " + (", ".join(f"{kind} x{n}" for kind, n in counts(plans).items()) or "nothing (everything is cached)"))
    if launcher == "volcano":
        print(manifests, end="")


def diff(
    a: Annotated[str, typer.Argument(help="An experiment file, or an artifact digest (prefix).")],
    b: Annotated[str, typer.Argument(help="An experiment file, or an artifact digest (prefix).")],
    root: RootOption = None,
    variant: Annotated[list[str] | None, typer.Option(
        "--variant", help="The variant of each sweep file to compare (its name, as `factory plan` lists it); twice: A's, then B's.",
    )] = None,
    everything: Annotated[bool, typer.Option(
        "--all", help="Two experiment files: also the fields both share, and every field of a section only one has.",
    )] = False,
) -> None:
    """Two experiments or two artifacts side by side: config as computed (only what differs), input artifacts, code identity."""
    from factory.ops.diff import diff_artifacts, diff_experiments, find_artifact

    registry = open_registry(settings_of(Path(a) if Path(a).is_file() else None, root).root / "registry")
    names = variant or []
    if Path(a).is_file() and Path(b).is_file():
        if len(names) > 2:
            raise ConfigError(f"--variant was given {len(names)} times; give it once (for every sweep file) or twice (A's, then B's)")
        first, second = (names[0], names[-1]) if names else (None, None)
        lines = diff_experiments(_variant_of(Path(a), first), _variant_of(Path(b), second), registry, everything)
    elif names:
        raise ConfigError("--variant picks a variant of a sweep file, but A and B are not both experiment files")
    else:
        lines = diff_artifacts(find_artifact(registry, a), find_artifact(registry, b), registry)
    for line in lines:
        out.print(line, markup=False, highlight=False)


def _variant_of(path: Path, name: str | None) -> Experiment:
    """The experiment of a file to compare: its only one (a file that is no sweep takes no variant), or the variant `name`."""
    variants = load_file(path)
    return pick_variant(path, variants, name if len(variants) > 1 else None)
