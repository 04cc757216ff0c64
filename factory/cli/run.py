"""`factory run`: refuse what `factory check` would, then materialize one experiment through Dagster (a subprocess).

Dagster runs as `python -m assets.run` in a process group of its own, so that this library never imports it and one
Ctrl-C stops the run in order. Before anything runs, `preflight` refuses a bad file and `check_commit` warns of (or,
with --strict, refuses) uncommitted changes: artifacts record the commit they were made from.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from factory.cli.common import ClusterOption, RootOption, dagster_home, err, hint, kubernetes, out, settings_of
from factory.cli.evals import print_leaderboard
from factory.config import Experiment, load_file
from factory.config.cluster import ClusterProfile, check_ray, load_profile
from factory.config.settings import Settings
from factory.data.catalog import CatalogConfig, open_catalog
from factory.errors import ConfigError
from factory.launch.group import run_group
from factory.launch.local import progress_env
from factory.ops.bases import resolve
from factory.preflight import check_files
from factory.registry import git_commit, open_registry
from factory.registry.provenance import file_state


def run(
    experiment: Annotated[Path, typer.Argument(help="The experiment file to materialize.")],
    root: RootOption = None,
    strict: Annotated[bool, typer.Option(help="Refuse to run from a working tree with uncommitted changes (CI, production).")] = False,
    launcher: Annotated[
        Literal["local", "volcano"], typer.Option(help="Where stages run: processes on this machine, or Volcano Jobs on Kubernetes.")
    ] = "local",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="With --launcher volcano: print the Job manifests (YAML) and exit.")] = False,
    cluster: ClusterOption = None,
) -> None:
    """Materialize every asset of one experiment through Dagster, then print the leaderboard."""
    try:
        settings = settings_of(experiment, root)
        variants = load_file(experiment)
        if launcher == "volcano" and dry_run:
            from factory.launch import volcano  # its manifest rules load a Kubernetes schema: only for --launcher volcano

            print(volcano.dry_run(variants, kubernetes(cluster)), end="")
            return
        profile = preflight(experiment, variants, settings, launcher, cluster)
    except ConfigError as e:
        err.print(str(e), markup=False, highlight=False)
        raise typer.Exit(2) from None
    if dry_run:
        err.print(f"error: --dry-run prints Volcano Job manifests: add --launcher volcano (for local runs, "
                  f"{hint(settings, 'plan', str(experiment))} shows what would run)", markup=False, highlight=False)
        raise typer.Exit(2)
    check_commit(experiment, strict)
    # Decided here, before Dagster captures the step's output (stderr is then a pipe): stages draw a progress bar on a terminal.
    env = {**progress_env(), **os.environ, **settings.environ(), "DAGSTER_HOME": str(dagster_home(settings.root))}
    if launcher == "volcano":
        env["FACTORY_CLUSTER"] = str(cluster)  # the code location's launcher resource reads it: stages become Volcano Jobs
    elif profile is not None and profile.ray is not None:
        env.update(profile.ray.environ())  # local stages run their data engine on the profile's Ray cluster
    out.print(f"[bold]materializing {', '.join(v.name for v in variants)}[/] through Dagster (instance {env['DAGSTER_HOME']})")
    # The command that goes on from where an interrupted run stopped: this one, with the options that change where and how it runs.
    again = hint(settings, "run", str(experiment), *(["--strict"] if strict else []),
                 *(["--launcher", launcher] if launcher == "volcano" else []), *(["--cluster", str(cluster)] if cluster is not None else []))
    # A group of its own: Ctrl-C reaches only this process, which stops the run in order (the run then says where it stopped).
    ended = run_group([sys.executable, "-m", "assets.run", str(experiment), "--root", str(settings.root), "--again", again], env)
    if ended.signals > 1:
        err.print(f"killed at once (a second interrupt); {again} goes on from the last checkpoint", markup=False, highlight=False)
    if ended.code != 0:
        raise typer.Exit(ended.code)
    print_leaderboard(settings)
    out.print(f"artifacts: {open_registry(settings.root / 'registry').location}/objects")
    catalog = CatalogConfig.at(settings.root)
    tables = "" if catalog.warehouse.startswith("file://") else f", tables in {catalog.warehouse}"
    where = catalog.uri.removeprefix("sqlite:///") if catalog.uri.startswith("sqlite:///") else "in $FACTORY_DATABASE_URL"
    out.print(f"datasets:  Iceberg catalog {where}{tables}")
    out.print(f"Dagster UI: {hint(settings, 'ui')}, then open http://127.0.0.1:3000", markup=False, highlight=False)


def preflight(experiment: Path, variants: list[Experiment], settings: Settings, launcher: str, cluster: Path | None) -> ClusterProfile | None:
    """ConfigError for everything `factory check` would refuse (and, for Volcano, what the cluster cannot run; a Ray
    cluster the profile names that does not answer), before any compute. Returns the profile, if any."""
    if launcher == "volcano":
        _submittable(variants, cluster)
    profile = load_profile(cluster) if cluster is not None else None
    if profile is not None:
        check_ray(cluster, profile)
    registry = open_registry(settings.root / "registry")
    [report] = check_files([experiment], catalog=lambda: open_catalog(CatalogConfig.at(settings.root)), cluster=profile,
                           bases=lambda variant: resolve(variant, registry), registry=registry)
    for warning in report.warnings:
        err.print(f"warning: {warning}", markup=False, highlight=False)
    if not report.ok:
        raise ConfigError("\n".join(report.errors) + f"\nnothing ran: fix the file ({hint(settings, 'check', str(experiment))} checks it again)")
    return profile


def check_commit(experiment: Path, strict: bool) -> None:
    """Warn that artifacts will record a -dirty commit; with `strict`, refuse (exit 2) instead."""
    commit = git_commit(experiment.parent, files=[experiment])
    if not commit.endswith("-dirty"):
        return
    state = file_state(experiment)
    why = f"{experiment} is {state}" if state else "the working tree has uncommitted changes"
    if strict:
        err.print(f"error: {why}; commit it (or drop --strict) so the run is reproducible from its commit", markup=False, highlight=False)
        raise typer.Exit(2)
    err.print(f"warning: {why}; artifacts will record commit {commit}", markup=False, highlight=False)


def _submittable(variants: list[Experiment], cluster: Path | None) -> None:
    """ConfigError unless the cluster profile can run these experiments on Volcano (checked before anything is submitted)."""
    from factory.launch import volcano

    if cluster is None:
        raise ConfigError("--launcher volcano needs a cluster profile: --cluster deploy/cluster-profile.yaml (or FACTORY_CLUSTER); "
                          "see deploy/README.md")
    profile = load_profile(cluster)
    if profile.launcher != "volcano" or profile.kubernetes is None:
        raise ConfigError(f"{cluster}: to submit to Volcano the profile needs `launcher: volcano` and a `kubernetes:` section "
                          "(namespace, kubeconfig or in_cluster, storage)")
    volcano.plan_jobs(variants, profile.kubernetes)  # every manifest validates, and every image is pinned
