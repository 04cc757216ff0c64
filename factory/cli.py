"""`factory`: check experiment files, run one through Dagster, open the UI, print the leaderboard (operations in `cli_operations`).

Dagster is started as a subprocess (`python -m assets.run`, `dagster dev`) so that this library
never imports it. Each command imports what it needs when it runs: `factory check` and `factory
plan` load no torch, no Kubernetes client and no plotting. Exit codes: 0 ok, 1 failure, 2 bad input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.console import Console
from rich.table import Table

from factory.atomic import write_atomic
from factory.config import Experiment, load, load_file, pick_variant
from factory.config.cluster import KubernetesSettings, load_profile
from factory.config.loader import DEFAULT_MAX_VARIANTS
from factory.config.stages import POOL_LIMITS
from factory.data.catalog import DATABASE_ENV, CatalogConfig, open_catalog, sqlalchemy_url
from factory.errors import ConfigError, FactoryError
from factory.launch.group import run_group
from factory.launch.local import progress_env
from factory.preflight import check_files, experiment_files
from factory.registry import ArtifactStore, git_commit
from factory.registry.provenance import file_state
from factory.stages.plan import build_plan, counts

if TYPE_CHECKING:
    from factory.evals.leaderboard import Board

DEFAULT_ROOT = Path(".factory")
# A pool nobody configured gets one slot; `python -m assets.pools` gives each of POOL_LIMITS its own at `factory ui`.
POOLS_YAML = f"""\
concurrency:
  pools:
    default_limit: {min(POOL_LIMITS.values())}
"""
DAGSTER_YAML = f"""\
# Embedded default: sqlite storage under this directory (written by `factory`).
telemetry:
  enabled: false
{POOLS_YAML}"""
DAGSTER_POSTGRES_YAML = f"""\
# The deploy profile: runs, events and schedules in PostgreSQL (written by `factory`; the URL is read from ${DATABASE_ENV}).
storage:
  postgres:
    postgres_url:
      env: {DATABASE_ENV}
telemetry:
  enabled: false
{POOLS_YAML}"""

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Model Factory: experiments as code, on Dagster.")
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
RootOption = Annotated[Path, typer.Option("--root", help="Where the embedded instance, registry and catalog live.")]


def dagster_home(root: Path) -> Path:
    """The persistent Dagster instance directory under `root`, with its dagster.yaml.

    With `$FACTORY_DATABASE_URL` set (the deploy profile), the instance keeps its runs, events and
    schedules in that PostgreSQL database (dagster-postgres), from a home of its own.
    """
    postgres = bool(os.environ.get(DATABASE_ENV))
    if postgres:  # dagster-postgres speaks psycopg2; SQLAlchemy would pick another driver for a bare postgresql:// URL
        os.environ[DATABASE_ENV] = sqlalchemy_url(os.environ[DATABASE_ENV])
    home = (root / ("dagster-postgres" if postgres else "dagster")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        write_atomic(config, DAGSTER_POSTGRES_YAML if postgres else DAGSTER_YAML)
    return home


@app.command()
def check(
    paths: Annotated[list[Path], typer.Argument(help="Experiment files or directories.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout, for machines.")] = False,
    max_variants: Annotated[int, typer.Option(help="A sweep may expand to at most this many variants.")] = DEFAULT_MAX_VARIANTS,
    root: RootOption = DEFAULT_ROOT,
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
    reports = check_files(files, max_variants, catalog=lambda: open_catalog(CatalogConfig.at(root)), cluster=profile)
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


ClusterOption = Annotated[
    Path | None, typer.Option("--cluster", envvar="FACTORY_CLUSTER", help="A cluster profile (YAML): its queues, and for the volcano launcher its `kubernetes` section.")
]


@app.command()
def plan(
    paths: Annotated[list[Path], typer.Argument(help="Experiment files or directories.")],
    root: RootOption = DEFAULT_ROOT,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout, for machines.")] = False,
    launcher: Annotated[
        Literal["local", "volcano"], typer.Option(help="volcano: print the Job manifest (YAML) of every stage that would run, after the table.")
    ] = "local",
    cluster: ClusterOption = None,
) -> None:
    """Show, without running anything, which stages are cached, will run (and why), or are waiting."""
    from factory.launch import volcano

    experiments = []
    for path in experiment_files(paths):
        experiments += load_file(path)
    registry = ArtifactStore(root / "registry")
    plans = build_plan(experiments, registry)
    if launcher == "volcano":
        try:
            manifests = volcano.dry_run(experiments, _kubernetes(cluster), registry)
        except ConfigError as e:
            err.print(str(e), markup=False, highlight=False)
            raise typer.Exit(2) from None
    if as_json:
        print(json.dumps({"stages": [p.to_json() for p in plans], "runs": counts(plans)}, indent=2))
        return
    table = Table(title="plan", title_justify="left")
    for column in ("experiment", "stage", "status", "detail"):
        table.add_column(column)
    styles = {"cached": "green", "run": "yellow", "waiting": "cyan", "shared": "dim"}
    for p in plans:
        table.add_row(p.experiment, p.kind, f"[{styles[p.status]}]{p.status}[/]", p.detail)
    out.print(table)
    out.print("will compute: " + (", ".join(f"{kind} x{n}" for kind, n in counts(plans).items()) or "nothing (everything is cached)"))
    if launcher == "volcano":
        print(manifests, end="")


def _kubernetes(cluster: Path | None) -> KubernetesSettings | None:
    """The `kubernetes` section of a cluster profile (None without a profile: the manifests leave namespace and storage out)."""
    return load_profile(cluster).kubernetes if cluster is not None else None


@app.command()
def run(
    experiment: Annotated[Path, typer.Argument(help="The experiment file to materialize.")],
    root: RootOption = DEFAULT_ROOT,
    strict: Annotated[bool, typer.Option(help="Refuse to run from a working tree with uncommitted changes (CI, production).")] = False,
    launcher: Annotated[
        Literal["local", "volcano"], typer.Option(help="Where stages run: processes on this machine, or Volcano Jobs on Kubernetes.")
    ] = "local",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="With --launcher volcano: print the Job manifests (YAML) and exit.")] = False,
    cluster: ClusterOption = None,
) -> None:
    """Materialize every asset of one experiment through Dagster, then print the leaderboard."""
    from factory.launch import volcano

    try:
        variants = load_file(experiment)
        if launcher == "volcano" and dry_run:
            print(volcano.dry_run(variants, _kubernetes(cluster)), end="")
            return
        if launcher == "volcano":
            _submittable(variants, cluster)
        # Everything `factory check` would refuse, refused before any compute.
        profile = load_profile(cluster) if cluster is not None else None
        [report] = check_files([experiment], catalog=lambda: open_catalog(CatalogConfig.at(root)), cluster=profile)
        for warning in report.warnings:
            err.print(f"warning: {warning}", markup=False, highlight=False)
        if not report.ok:
            raise ConfigError("\n".join(report.errors) + f"\nnothing ran: fix the file (`factory check {experiment}` checks it again)")
    except ConfigError as e:
        err.print(str(e), markup=False, highlight=False)
        raise typer.Exit(2) from None
    if dry_run:
        err.print(f"error: --dry-run prints Volcano Job manifests: add --launcher volcano (for local runs, `factory plan {experiment}` "
                  "shows what would run)")
        raise typer.Exit(2)
    commit = git_commit(experiment.parent, files=[experiment])
    if commit.endswith("-dirty"):
        state = file_state(experiment)
        why = f"{experiment} is {state}" if state else "the working tree has uncommitted changes"
        if strict:
            err.print(f"error: {why}; commit it (or drop --strict) so the run is reproducible from its commit", markup=False, highlight=False)
            raise typer.Exit(2)
        err.print(f"warning: {why}; artifacts will record commit {commit}", markup=False, highlight=False)
    # Decided here, before Dagster captures the step's output (stderr is then a pipe): stages draw a progress bar on a terminal.
    env = {**progress_env(), **os.environ, "DAGSTER_HOME": str(dagster_home(root))}
    if launcher == "volcano":
        env["FACTORY_CLUSTER"] = str(cluster)  # the code location's launcher resource reads it: stages become Volcano Jobs
    out.print(f"[bold]materializing {', '.join(v.name for v in variants)}[/] through Dagster (instance {env['DAGSTER_HOME']})")
    # A group of its own: Ctrl-C reaches only this process, which stops the run in order (the run then says where it stopped).
    ended = run_group([sys.executable, "-m", "assets.run", str(experiment), "--root", str(root)], env)
    if ended.signals > 1:
        err.print(f"killed at once (a second interrupt); `factory run {experiment}` goes on from the last checkpoint", markup=False, highlight=False)
    if ended.code != 0:
        raise typer.Exit(ended.code)
    _print_leaderboard(root)
    out.print(f"artifacts: {(root / 'registry' / 'objects').resolve()}")
    out.print(f"datasets:  Iceberg catalog {(root / 'iceberg' / 'catalog.db').resolve()}")
    out.print("Dagster UI: [bold]make ui[/] (or `factory ui`), then open http://127.0.0.1:3000")


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


@app.command()
def diff(
    a: Annotated[str, typer.Argument(help="An experiment file, or an artifact digest (prefix).")],
    b: Annotated[str, typer.Argument(help="An experiment file, or an artifact digest (prefix).")],
    root: RootOption = DEFAULT_ROOT,
    variant: Annotated[list[str] | None, typer.Option(
        "--variant", help="The variant of each sweep file to compare (its name, as `factory plan` lists it); twice: A's, then B's.",
    )] = None,
) -> None:
    """Two experiments or two artifacts side by side: config, input artifacts, code identity."""
    from factory.stages.diff import diff_artifacts, diff_experiments, find_artifact

    registry = ArtifactStore(root / "registry")
    names = variant or []
    if Path(a).is_file() and Path(b).is_file():
        if len(names) > 2:
            raise ConfigError(f"--variant was given {len(names)} times; give it once (for every sweep file) or twice (A's, then B's)")
        first, second = (names[0], names[-1]) if names else (None, None)
        lines = diff_experiments(_variant_of(Path(a), first), _variant_of(Path(b), second), registry)
    elif names:
        raise ConfigError("--variant picks a variant of a sweep file, but A and B are not both experiment files")
    else:
        lines = diff_artifacts(find_artifact(registry, a), find_artifact(registry, b))
    for line in lines:
        out.print(line, markup=False, highlight=False)


def _variant_of(path: Path, name: str | None) -> Experiment:
    """The experiment of a file to compare: its only one (a file that is no sweep takes no variant), or the variant `name`."""
    variants = load_file(path)
    return pick_variant(path, variants, name if len(variants) > 1 else None)


@app.command()
def leaderboard(
    root: RootOption = DEFAULT_ROOT,
    sort: Annotated[str | None, typer.Option(help="Benchmark to rank by (default: heldout_bpb, else val_bpb).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for machines.")] = False,
    html: Annotated[Path | None, typer.Option(help="Also write the board as a static HTML page here.")] = None,
) -> None:
    """Every experiment at its best checkpoint, scored on every benchmark (from the registry's evaluation results)."""
    from factory.evals.leaderboard import render_html
    from factory.stages.leaderboard import current_board

    try:
        board = current_board(ArtifactStore(root / "registry"), sort)
    except ConfigError as e:
        err.print(f"error: {e}", markup=False, highlight=False)
        raise typer.Exit(2) from None
    if html is not None:
        write_atomic(html, render_html(board))
    if as_json:
        out.print_json(json.dumps(board.to_json()))
    elif not _print_leaderboard(root, board):
        raise typer.Exit(1)


@app.command()
def ui(root: RootOption = DEFAULT_ROOT, port: int = 3000) -> None:
    """Start the Dagster UI (`dagster dev`) on the same instance as `factory run`."""
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home(root)), "FACTORY_ROOT": str(root.resolve())}
    pools = subprocess.run([sys.executable, "-m", "assets.pools"], env=env, check=False)  # the pools' limits, before the daemon runs
    if pools.returncode != 0:
        raise typer.Exit(pools.returncode)
    # A group of its own: one SIGINT or SIGTERM here stops it all, the runs its daemon launched included (`run_group`).
    ended = run_group([sys.executable, "-m", "dagster", "dev", "--port", str(port), "--host", "127.0.0.1"], env)
    raise typer.Exit(0 if ended.signals else ended.code)


@app.command()
def podium(
    root: RootOption = DEFAULT_ROOT,
    host: Annotated[str, typer.Option(help="Address to listen on; 127.0.0.1 keeps Podium on this machine, 0.0.0.0 exposes it.")] = "127.0.0.1",
    port: int = 8765,
    allowed_host: Annotated[
        list[str] | None, typer.Option("--allowed-host", help="Another name people reach Podium by (a proxy's), when --host exposes it.")
    ] = None,
) -> None:
    """Open Podium: browse dataset tables and their snapshots, run SQL, and generate from checkpoints in the browser."""
    from factory.podium.app import serve

    if not (root / "iceberg").exists() and not (root / "registry").exists():
        err.print(f"warning: {root.resolve()} holds no catalog or registry yet; run an experiment first (`make run`)")
    out.print(f"Podium on http://{'[' + host + ']' if ':' in host else host}:{port}/ (Ctrl-C stops it)")
    serve(root, host=host, port=port, allowed_hosts=allowed_host or ())


def _print_leaderboard(root: Path, board: Board | None = None) -> bool:
    from factory.evals.leaderboard import cell, heading, legend, ranks
    from factory.stages.leaderboard import current_board

    board = board or current_board(ArtifactStore(root / "registry"))
    if not board.rows:
        err.print(f"no evaluations in {root.resolve()} yet: run `factory run experiments/<name>.md` first")
        return False
    names = sorted(board.benchmarks)
    table = Table(title=f"leaderboard (ranked by {board.sort})", title_justify="left", caption=legend(board) or None, caption_justify="left")
    for column in ("rank", "experiment", "best checkpoint", *(heading(board, n) for n in names), "tokens", "commit", "tracker", "note"):
        table.add_column(column, no_wrap=column not in ("tracker", "note"))
    for rank, row in zip(ranks(board), board.rows, strict=True):
        scores = [cell(board, row, n) for n in names]
        table.add_row(rank, row.experiment, row.checkpoint, *scores, f"{row.tokens_seen:,}", row.git_commit[:12], row.tracker_url, row.note)
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    return True


evals_app = typer.Typer(no_args_is_help=True, help="Benchmarks and evaluations of checkpoints.")
app.add_typer(evals_app, name="evals")


@evals_app.command("list")
def evals_list() -> None:
    """The registered benchmarks."""
    from factory.evals.benchmarks import registered

    table = Table(title="benchmarks", title_justify="left")
    for column in ("name", "version", "better", "description"):
        table.add_column(column)
    for bench in sorted(registered().values(), key=lambda b: b.name):
        table.add_row(bench.name, str(bench.version), "lower" if bench.lower_is_better else "higher", bench.description)
    out.print(table)


@evals_app.command("backfill")
def evals_backfill(
    benchmark: Annotated[str, typer.Option(help="The registered benchmark to evaluate every recorded checkpoint on.")],
    root: RootOption = DEFAULT_ROOT,
) -> None:
    """Evaluate every checkpoint recorded so far on one benchmark (batched: many partitions per run), then the leaderboard."""
    from factory.evals.benchmarks import known, registered

    if not known(benchmark):
        err.print(f"error: unknown benchmark {benchmark!r}; registered: {', '.join(sorted(registered()))}")
        raise typer.Exit(2)
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home(root))}
    ended = run_group([sys.executable, "-m", "assets.backfill", "--benchmark", benchmark, "--root", str(root)], env)
    if ended.code != 0:
        raise typer.Exit(ended.code)
    _print_leaderboard(root)


@evals_app.command("compare")
def evals_compare(
    candidate: Annotated[str, typer.Argument(help="The experiment that must be better.")],
    baseline: Annotated[str, typer.Argument(help="The experiment it is compared with.")],
    benchmark: Annotated[str, typer.Option(help="The benchmark compared, each experiment at its best checkpoint.")] = "heldout_bpb",
    min_improvement: Annotated[float, typer.Option(help="Relative improvement required, e.g. 0.05 for 5%.")] = 0.0,
    root: RootOption = DEFAULT_ROOT,
) -> None:
    """Exit 0 when CANDIDATE beats BASELINE on a benchmark by at least --min-improvement, 1 when not (`make nightly`); exit 2
    when their scores do not compare (another version, or other data such as each one's own held-out split)."""
    from factory.evals.scored_on import describe
    from factory.stages.leaderboard import current_board

    board = current_board(ArtifactStore(root / "registry"))
    rows = {row.experiment: row for row in board.rows}
    missing = [name for name in (candidate, baseline) if name not in rows or benchmark not in rows[name].scores]
    if missing:
        err.print(f"error: no {benchmark} results for {', '.join(missing)} in {root.resolve()}: run and evaluate them first")
        raise typer.Exit(2)
    if not rows[candidate].compares_with(rows[baseline], benchmark):
        scored = "; ".join(f"{name}'s on {describe(rows[name].scored_on(benchmark))} (version {rows[name].versions.get(benchmark, '?')})"
                           for name in (candidate, baseline))
        err.print(f"error: {candidate} and {baseline} have {benchmark} scores that do not compare: {scored}. "
                  "Compare on a benchmark both were scored on alike, such as heldout_bpb", markup=False, highlight=False)
        raise typer.Exit(2)
    new, old = rows[candidate].scores[benchmark], rows[baseline].scores[benchmark]
    gain = ((old - new) if board.benchmarks[benchmark] else (new - old)) / max(abs(old), 1e-12)
    verdict = "better" if gain >= min_improvement else "NOT better enough"
    out.print(f"{candidate} {benchmark} {new:.4f} vs {baseline} {old:.4f}: {gain:+.1%} ({verdict}; required {min_improvement:+.1%})")
    if gain < min_improvement:
        raise typer.Exit(1)


@evals_app.command("stages")
def evals_stages(
    experiment: Annotated[str, typer.Argument(help="The experiment whose training stages are compared.")],
    benchmark: Annotated[str, typer.Option(help="The benchmark, at each stage's last evaluated checkpoint.")] = "code_exec",
    must_improve: Annotated[list[str], typer.Option(help="A stage that must score better than the stage before it (repeatable).")] = [],  # noqa: B006
    root: RootOption = DEFAULT_ROOT,
) -> None:
    """What each training stage bought: pretrain -> sft -> rl on one benchmark. Exit 1 when a --must-improve stage did not."""
    from factory.evals.leaderboard import stage_scores
    from factory.stages.eval_request import KIND as EVALUATION_KIND

    registry = ArtifactStore(root / "registry")
    scores = stage_scores(registry.manifests(EVALUATION_KIND), experiment, benchmark)
    if not scores:
        err.print(f"error: no {benchmark} results for {experiment} in {root.resolve()}: run and evaluate it first")
        raise typer.Exit(2)
    lower = scores[0].lower_is_better
    table = Table(title=f"{experiment}: {benchmark} ({'lower' if lower else 'higher'} is better) at each stage's last checkpoint",
                  title_justify="left")
    for column in ("stage", "checkpoint", "score", "items", "change"):
        table.add_column(column)
    failed = []
    for before, now in zip([None, *scores], scores, strict=False):
        change = "" if before is None else f"{now.value - before.value:+.4f}"
        better = before is not None and (now.value < before.value if lower else now.value > before.value)
        if now.stage in must_improve and not better:
            failed.append(f"{now.stage} did not improve on {before.stage if before else 'nothing (it is the first stage)'}")
        table.add_row(now.stage, now.checkpoint, f"{now.value:.4f}", str(now.count), change)
    out.print(table)
    if unknown := sorted(set(must_improve) - {s.stage for s in scores}):
        err.print(f"error: no {benchmark} results for stage(s) {', '.join(unknown)} of {experiment}")
        raise typer.Exit(2)
    if failed:
        err.print("; ".join(failed))
        raise typer.Exit(1)


data_app = typer.Typer(no_args_is_help=True, help="Look inside datasets and the batches training saw.")
app.add_typer(data_app, name="data")


@data_app.command("batch")
def data_batch(
    experiment: Annotated[Path, typer.Argument(help="The experiment file whose run to look into.")],
    step: Annotated[int, typer.Argument(help="The training step (0-based).")],
    root: RootOption = DEFAULT_ROOT,
    as_json: Annotated[bool, typer.Option("--json", help="Token ids and documents as JSON, for machines.")] = False,
    variant: Annotated[str | None, typer.Option("--variant", help="For a sweep file: the variant whose run to look into (its name).")] = None,
) -> None:
    """Fetch again the exact batch a training step consumed: its sequences and the documents in them."""
    from factory.stages.batch import fetch_batch
    from factory.stages.batch import to_json as batch_json

    chosen = load(experiment, variant)
    catalog = open_catalog(CatalogConfig.at(root))
    sequences = fetch_batch(chosen, step, ArtifactStore(root / "registry"), catalog)
    if as_json:
        print(json.dumps({"step": step, "sequences": batch_json(sequences)}, indent=2))
        return
    table = Table(title=f"batch of step {step}", title_justify="left")
    for column in ("seq", "tokens", "documents"):
        table.add_column(column)
    for index, sequence in enumerate(sequences):
        documents = ", ".join(f"{d.get('table', '?')}:{d.get('path', d['id'])}" for d in sequence.documents)
        table.add_row(str(index), str(sequence.real_tokens), documents)
    out.print(table)


from factory import cli_operations  # noqa: E402,F401  (registers lineage, reproduce, promote, demote, promotions)
from factory import cli_registry  # noqa: E402,F401  (registers `registry verify`)


def main() -> None:
    """Console-script entry point: factory errors and unusable paths end as a message, not a traceback."""
    try:
        app(prog_name="factory")
    except FactoryError as e:
        err.print(f"error: {e}", markup=False, highlight=False)
        sys.exit(e.exit_code)
    except OSError as e:
        err.print(f"error: {e.strerror or e}: {e.filename or ''} (check the paths you gave)", markup=False, highlight=False)
        sys.exit(2)
