"""Stage-kind plugins as Python finds installed packages: a `site` directory on PYTHONPATH holding a package's module and
its `.dist-info` (entry points included), made by pip from the example package or written here for broken ones."""

import contextlib
import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from factory.config import fingerprint, plugins
from factory.config.filter_kinds import document_filters
from factory.config.source_kinds import source_kinds
from tests.forked import factory_command

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "checkpoint-average"


def fake_package(site: Path, name: str, module: str, entry_points: dict[str, str], group: str = "model_factory.stages") -> Path:
    """A package installed into `site` as pip would leave it: `module.py` and a dist-info naming its entry points in `group`."""
    dist = site / f"{name}-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 0.1\n")
    lines = "".join(f"{key} = {value}\n" for key, value in entry_points.items())
    (dist / "entry_points.txt").write_text(f"[{group}]\n{lines}")
    (site / f"{name}.py").write_text(module)
    return site


def factory_with(site: Path | None, *args: str, cwd: Path = REPO, timeout: float = 600, env: dict[str, str] | None = None,
                 ) -> subprocess.CompletedProcess:
    """`factory ARGS` with the packages of `site` installed (on PYTHONPATH; None: none), and `env` set."""
    env = {**os.environ, "FACTORY_TRACKER": "none", **(env or {})}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return factory_command(*args, cwd=cwd, env=env, timeout_s=timeout)


def pip_installed(site: Path, *packages: Path) -> Path:
    """The packages at `packages` installed by pip into the directory `site`."""
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--disable-pip-version-check",
                    "--target", str(site), *map(str, packages)], check=True, capture_output=True, timeout=300)
    return site


@contextlib.contextmanager
def installed(site: Path) -> Iterator[None]:
    """The source kinds of the packages in `site` registered in this process too, while inside (read again on leaving)."""
    sys.path.insert(0, str(site))
    _read_registries_again()
    try:
        yield
    finally:
        sys.path.remove(str(site))
        _read_registries_again()


def _read_registries_again() -> None:
    importlib.invalidate_caches()
    plugins._installed.cache_clear()
    source_kinds.cache_clear()
    document_filters.cache_clear()
    fingerprint._distributions.cache_clear()  # which distribution a plugin's module belongs to (its code identity's name)


@pytest.fixture(scope="session")
def example_site(tmp_path_factory) -> Path:
    """The example plugin package, installed by pip into a directory of its own."""
    return pip_installed(tmp_path_factory.mktemp("example-site"), EXAMPLE)


@pytest.fixture(scope="session")
def plugins_site(tmp_path_factory) -> Path:
    """The DPO and average example packages, installed by pip into a directory of their own."""
    site = tmp_path_factory.mktemp("plugins-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--disable-pip-version-check",
                    "--target", str(site), str(REPO / "examples" / "dpo"), str(EXAMPLE)], check=True, capture_output=True, timeout=300)
    return site
