"""`factory ui | podium`: the long-running servers, the Dagster UI on the instance `factory run` uses and Podium."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Annotated

import typer

from factory.cli.common import RootOption, dagster_home, err, hint, out, settings_of
from factory.launch.group import run_group
from factory.launch.local import warm_starts
from factory.launch.warm import SHARED_SOCKET_ENV
from factory.runtime import every_warm_module, tracker_backend


def ui(root: RootOption = None, port: int = 3000) -> None:
    """Start the Dagster UI (`dagster dev`) on the same instance as `factory run`."""
    settings = settings_of(None, root)
    env = {**os.environ, **settings.environ(), "DAGSTER_HOME": str(dagster_home(settings.root))}
    pools = subprocess.run([sys.executable, "-m", "assets.pools"], env=env, check=False)  # the pools' limits, before the daemon runs
    if pools.returncode != 0:
        raise typer.Exit(pools.returncode)
    # The stages of the runs its daemon and UI launch fork from one warm interpreter, as those of `factory run` do: it
    # imports what every stage kind needs once, in the background, and lives as long as this command.
    with warm_starts(every_warm_module(tracker_backend(env)), env) as warm:
        if warm is not None:
            env[SHARED_SOCKET_ENV] = str(warm.socket_path)
        # A group of its own: one SIGINT or SIGTERM here stops it all, the runs its daemon launched included (`run_group`).
        ended = run_group([sys.executable, "-m", "dagster", "dev", "--port", str(port), "--host", "127.0.0.1"], env)
    raise typer.Exit(0 if ended.signals else ended.code)


def podium(
    root: RootOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on; 127.0.0.1 keeps Podium on this machine, 0.0.0.0 exposes it.")] = "127.0.0.1",
    port: int = 8765,
    allowed_host: Annotated[
        list[str] | None, typer.Option("--allowed-host", help="Another name people reach Podium by (a proxy's), when --host exposes it.")
    ] = None,
) -> None:
    """Open Podium: browse dataset tables and their snapshots, run SQL, and generate from checkpoints in the browser."""
    from factory.podium.app import serve

    settings = settings_of(None, root)
    root = settings.root
    if not (root / "iceberg").exists() and not (root / "registry").exists():
        err.print(f"warning: {root} holds no catalog or registry yet; run an experiment first "
                  f"({hint(settings, 'run', 'experiments/<name>.md')})", markup=False, highlight=False)
    out.print(f"Podium on http://{'[' + host + ']' if ':' in host else host}:{port}/ (Ctrl-C stops it)")
    serve(root, host=host, port=port, allowed_hosts=allowed_host or ())
