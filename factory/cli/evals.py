"""`factory leaderboard` and `factory evals list | backfill | compare | stages`: how checkpoints score on benchmarks."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from factory.atomic import write_atomic
from factory.cli.common import RootOption, dagster_home, err, hint, out, settings_of
from factory.config.settings import Settings
from factory.errors import ConfigError
from factory.launch.group import run_group
from factory.registry import open_registry

if TYPE_CHECKING:
    from factory.evals.leaderboard import Board

evals_app = typer.Typer(no_args_is_help=True, help="Benchmarks and evaluations of checkpoints.")


def leaderboard(
    root: RootOption = None,
    sort: Annotated[str | None, typer.Option(
        "--benchmark", "--sort", help="The benchmark to rank by (default: the one most experiment files name as eval.primary; "
                                      "heldout_bpb, else val_bpb, for a file without one).",
    )] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for machines.")] = False,
    html: Annotated[Path | None, typer.Option(help="Also write the board as a static HTML page here.")] = None,
) -> None:
    """Every experiment at the model it exported, scored on every benchmark (from the registry's evaluation results); a run
    that exported no model is marked unfinished and never ranked."""
    from factory.evals.leaderboard import render_html
    from factory.evals.publish import current_board

    settings = settings_of(None, root)
    try:
        board = current_board(open_registry(settings.root / "registry"), sort)
    except ConfigError as e:
        err.print(f"error: {e}", markup=False, highlight=False)
        raise typer.Exit(2) from None
    if html is not None:
        write_atomic(html, render_html(board))
    if as_json:
        out.print_json(json.dumps(board.to_json()))
    elif not print_leaderboard(settings, board):
        raise typer.Exit(1)


def print_leaderboard(settings: Settings, board: Board | None = None) -> bool:
    """Print the board (the current one unless given) as a table; False, with a hint, when nothing is evaluated yet."""
    from factory.evals.leaderboard import cell, heading, legend, model_cell, ranks
    from factory.evals.publish import current_board

    board = board or current_board(open_registry(settings.root / "registry"))
    if not board.rows:
        err.print(f"no evaluations in {settings.root} yet: run {hint(settings, 'run', 'experiments/<name>.md')} first",
                  markup=False, highlight=False)
        return False
    names = sorted(board.benchmarks)
    table = Table(title=f"leaderboard (ranked by {board.sort})", title_justify="left", caption=legend(board) or None, caption_justify="left")
    for column in ("rank", "experiment", "model", "checkpoint", *(heading(board, n) for n in names), "tokens", "commit", "tracker", "base", "note"):
        table.add_column(column, no_wrap=column not in ("tracker", "note"))
    for rank, row in zip(ranks(board), board.rows, strict=True):
        scores = [cell(board, row, n) for n in names]
        table.add_row(rank, row.experiment, model_cell(row), row.checkpoint, *scores, f"{row.tokens_seen:,}", row.git_commit[:12], row.tracker_url,
                      row.base, row.note)
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    return True


@evals_app.command("list")
def evals_list(
    root: RootOption = None, as_json: Annotated[bool, typer.Option("--json", help="Print JSON for machines.")] = False,
) -> None:
    """The registered benchmarks (plugins and the repository's settings included); takes --root as every command does."""
    from factory.evals.benchmarks import registered

    settings_of(None, root)  # a broken settings file is refused here as by every other command

    benchmarks = sorted(registered().values(), key=lambda b: b.name)
    if as_json:
        print(json.dumps([{"name": b.name, "version": b.version, "better": "lower" if b.lower_is_better else "higher",
                           "data": b.data, "requires": list(b.requires), "missing": list(b.missing), "code": b.code,
                           "description": b.description} for b in benchmarks], indent=2))
        return
    table = Table(title="benchmarks", title_justify="left")
    for column in ("name", "version", "better", "description"):
        table.add_column(column)
    for bench in benchmarks:
        missing = f" (needs {', '.join(bench.missing)}: not installed)" if bench.missing else ""
        table.add_row(bench.name, str(bench.version), "lower" if bench.lower_is_better else "higher", bench.description + missing)
    out.print(table)


@evals_app.command("backfill")
def evals_backfill(
    benchmark: Annotated[str, typer.Option(help="The registered benchmark to evaluate every recorded checkpoint on.")],
    root: RootOption = None,
) -> None:
    """Evaluate every checkpoint recorded so far on one benchmark (batched: many partitions per run), then the leaderboard."""
    from factory.evals.benchmarks import known, registered

    if not known(benchmark):
        err.print(f"error: unknown benchmark {benchmark!r}; registered: {', '.join(sorted(registered()))}")
        raise typer.Exit(2)
    settings = settings_of(None, root)
    env = {**os.environ, **settings.environ(), "DAGSTER_HOME": str(dagster_home(settings.root))}
    ended = run_group([sys.executable, "-m", "assets.backfill", "--benchmark", benchmark, "--root", str(settings.root)], env)
    if ended.code != 0:
        raise typer.Exit(ended.code)
    print_leaderboard(settings)


@evals_app.command("compare")
def evals_compare(
    candidate: Annotated[str, typer.Argument(help="The experiment that must be better.")],
    baseline: Annotated[str, typer.Argument(help="The experiment it is compared with.")],
    benchmark: Annotated[str, typer.Option(help="The benchmark compared, each experiment at the model it exported.")] = "heldout_bpb",
    min_improvement: Annotated[float, typer.Option(help="Relative improvement required, e.g. 0.05 for 5%.")] = 0.0,
    root: RootOption = None,
) -> None:
    """Exit 0 when CANDIDATE beats BASELINE on a benchmark by at least --min-improvement, 1 when not (`make nightly`); exit 2
    when their scores do not compare (another version, or other data such as each one's own held-out split)."""
    from factory.evals.scored_on import describe
    from factory.evals.publish import current_board

    root = settings_of(None, root).root
    board = current_board(open_registry(root / "registry"))
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
    root: RootOption = None,
) -> None:
    """What each training stage bought: pretrain -> sft -> rl on one benchmark. Exit 1 when a --must-improve stage did not."""
    from factory.evals.base import EVALUATIONS
    from factory.evals.leaderboard import stage_scores
    from factory.registry.index import Where

    root = settings_of(None, root).root
    registry = open_registry(root / "registry")
    scores = stage_scores(registry.manifests(EVALUATIONS, Where(experiment=experiment)), experiment, benchmark)
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
