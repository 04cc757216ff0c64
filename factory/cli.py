"""`factory`: check experiment files, run one through Dagster, open the UI, print the leaderboard.

Dagster is started as a subprocess (`python -m assets.run`, `dagster dev`) so that this library
never imports it. Exit codes: 0 ok, 1 failure, 2 bad input.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from factory.config import load_file
from factory.errors import ConfigError, FactoryError
from factory.registry import ArtifactStore
from factory.stages.leaderboard import latest_leaderboard

DEFAULT_ROOT = Path(".factory")
DAGSTER_YAML = """\
# Embedded default: sqlite storage under this directory (written by `factory`).
telemetry:
  enabled: false
"""

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Model Factory: experiments as code, on Dagster.")
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
RootOption = Annotated[Path, typer.Option("--root", help="Where the embedded instance, registry and catalog live.")]


def dagster_home(root: Path) -> Path:
    """The persistent Dagster instance directory under `root`, with its dagster.yaml."""
    home = (root / "dagster").resolve()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        tmp = config.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(DAGSTER_YAML)
        tmp.replace(config)
    return home


@app.command()
def check(paths: Annotated[list[Path], typer.Argument(help="Experiment files or directories.")]) -> None:
    """Validate experiment files without running anything."""
    files = [f for p in paths for f in (sorted(p.glob("*.md")) if p.is_dir() else [p])]
    if not files:
        err.print("error: no experiment files given (pass .md files or directories holding them)")
        raise typer.Exit(2)
    failed = 0
    owners: dict[str, Path] = {}
    for path in files:
        try:
            variants = load_file(path)
        except ConfigError as e:
            failed += 1
            err.print(str(e), markup=False, highlight=False)
            continue
        clashes = [v.name for v in variants if owners.setdefault(v.name, path) != path]
        if clashes:
            failed += 1
            err.print(f"{path}: experiment name {clashes[0]!r} is also defined by {owners[clashes[0]]}; give each a distinct name", markup=False)
            continue
        out.print(f"ok  {path}  ({', '.join(v.name for v in variants)})", markup=False, highlight=False)
    if failed:
        raise typer.Exit(2)


@app.command()
def run(experiment: Annotated[Path, typer.Argument(help="The experiment file to materialize.")], root: RootOption = DEFAULT_ROOT) -> None:
    """Materialize every asset of one experiment through Dagster, then print the leaderboard."""
    try:
        variants = load_file(experiment)
    except ConfigError as e:
        err.print(str(e), markup=False, highlight=False)
        raise typer.Exit(2) from None
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home(root))}
    out.print(f"[bold]materializing {', '.join(v.name for v in variants)}[/] through Dagster (instance {env['DAGSTER_HOME']})")
    code = subprocess.call([sys.executable, "-m", "assets.run", str(experiment), "--root", str(root)], env=env)
    if code != 0:
        raise typer.Exit(code)
    _print_leaderboard(root)
    out.print(f"artifacts: {(root / 'registry' / 'objects').resolve()}")
    out.print(f"datasets:  Iceberg catalog {(root / 'iceberg' / 'catalog.db').resolve()}")
    out.print("Dagster UI: [bold]make ui[/] (or `factory ui`), then open http://127.0.0.1:3000")


@app.command()
def leaderboard(root: RootOption = DEFAULT_ROOT) -> None:
    """Print the most recent leaderboard."""
    if not _print_leaderboard(root):
        raise typer.Exit(1)


@app.command()
def ui(root: RootOption = DEFAULT_ROOT, port: int = 3000) -> None:
    """Start the Dagster UI (`dagster dev`) on the same instance as `factory run`."""
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home(root)), "FACTORY_ROOT": str(root.resolve())}
    raise typer.Exit(subprocess.call([sys.executable, "-m", "dagster", "dev", "--port", str(port), "--host", "127.0.0.1"], env=env))


def _print_leaderboard(root: Path) -> bool:
    markdown = latest_leaderboard(ArtifactStore(root / "registry"))
    if markdown is None:
        err.print(f"no leaderboard in {root.resolve()} yet: run `factory run experiments/<name>.md` first")
        return False
    out.print("\n[bold]leaderboard[/]")
    out.print(markdown, markup=False, highlight=False)
    return True


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
