"""What every `factory` command shares: the consoles, the `--root` and `--cluster` options, the settings they override,
the hints that repeat them, and the Dagster instance's home.

Dagster is started as a subprocess (`python -m assets.run`, `dagster dev`) so that this library never imports it; its
instance lives under the root (`--root`, else the settings of the repository: `factory.config.settings`), in the
directory `dagster_home` prepares, and the processes it starts get the settings in their environment.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from factory.atomic import write_atomic
from factory.config.cluster import KubernetesSettings, load_profile
from factory.config.pools import POOL_LIMITS
from factory.config.settings import Settings, load_settings
from factory.data.catalog import DATABASE_ENV, sqlalchemy_url

# A pool nobody configured gets one slot; `python -m assets.pools` gives each of POOL_LIMITS its own at `factory ui`.
POOLS_YAML = f"""\
concurrency:
  pools:
    default_limit: {min(POOL_LIMITS.values())}
"""
# No usage reports, and no "Join the Dagster community" dialog over the asset graph of a fresh instance (`nux`).
QUIET_YAML = """\
telemetry:
  enabled: false
nux:
  enabled: false
"""
# Dagster's SQLite storage and compute logs, through the factory's instance class (assets/instance.py).
INSTANCE_CLASS_YAML = """\
instance_class:
  module: assets.instance
  class: FactoryInstance
"""
DAGSTER_YAML = f"""\
# Embedded default: sqlite storage under this directory (written by `factory`).
{INSTANCE_CLASS_YAML}{QUIET_YAML}{POOLS_YAML}"""
DAGSTER_POSTGRES_YAML = f"""\
# The deploy profile: runs, events and schedules in PostgreSQL (written by `factory`; the URL is read from ${DATABASE_ENV}).
storage:
  postgres:
    postgres_url:
      env: {DATABASE_ENV}
{QUIET_YAML}{POOLS_YAML}"""

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
RootOption = Annotated[Path | None, typer.Option(
    "--root", help="Where the embedded instance, registry and catalog live (default: `root` in the repository's factory.toml, "
                   "$FACTORY_ROOT, else <repository>/.factory).",
)]
ClusterOption = Annotated[
    Path | None, typer.Option("--cluster", envvar="FACTORY_CLUSTER", help="A cluster profile (YAML): its queues, and for the volcano launcher its `kubernetes` section.")
]


def settings_of(start: Path | None, root: Path | None) -> Settings:
    """The settings of the repository holding `start` (the experiment file; default: the current directory), `--root` over them."""
    settings = load_settings(start)
    return settings if root is None else replace(settings, root=root.resolve())


def hint(settings: Settings, *words: str) -> str:
    """`factory WORDS [--root R]`, quoted: a command to print as advice, with the root this command used wherever the command
    typed from here would find another (so following it reaches the same instance)."""
    root = ["--root", str(settings.root)] if load_settings().root != settings.root else []
    return f"`{shlex.join(['factory', *words, *root])}`"


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


def kubernetes(cluster: Path | None) -> KubernetesSettings | None:
    """The `kubernetes` section of a cluster profile (None without a profile: the manifests leave namespace and storage out)."""
    return load_profile(cluster).kubernetes if cluster is not None else None
