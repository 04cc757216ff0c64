"""The settings a user would otherwise repeat on every command: one file per repository, then the environment.

`factory.toml` at the repository's root, or a `[tool.factory]` table in its pyproject.toml, holds the root of the
instance (`root`), the directories directory sources may read (`data_roots`), the modules that register more
benchmarks (`benchmarks`) and the pools' limits (`[pools] training = 2`). Paths in it are relative to its directory.
Every command reads the file of the repository its experiment file is in (or of the current directory); the
environment overrides it (`FACTORY_ROOT`, `FACTORY_DATA_ROOTS`, `FACTORY_BENCHMARKS`, `FACTORY_POOL_<NAME>`), and a
command's options override both. A file that is wrong is a ConfigError naming `file:line`.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from factory.config.files import DATA_ROOTS_ENV, read_bounded, repository_root
from factory.config.pools import POOL_LIMITS
from factory.errors import ConfigError

SETTINGS_FILE = "factory.toml"
PYPROJECT = "pyproject.toml"
ROOT_ENV = "FACTORY_ROOT"
BENCHMARKS_ENV = "FACTORY_BENCHMARKS"
"""Comma-separated modules that register more benchmarks."""
POOL_ENV_PREFIX = "FACTORY_POOL_"
DEFAULT_ROOT = ".factory"
"""The root, relative to the repository, when nothing names one."""
KEYS = ("root", "data_roots", "benchmarks", "pools")
_AT_LINE = re.compile(r"\(at line (\d+), column \d+\)")


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    """The settings in force for one repository: its file's, overridden by the environment's."""

    repository: Path
    """The repository they were read for (the git toplevel of the experiment file, or of the current directory)."""
    file: Path | None
    """The file they were read from; None when the repository has none."""
    root: Path
    """Where the embedded instance, registry and catalog live (absolute)."""
    data_roots: tuple[Path, ...]
    """The directories directory sources and checkpoints may be read under (absolute, resolved); default the repository."""
    benchmarks: tuple[str, ...] = ()
    """Modules whose import registers more benchmarks."""
    pools: Mapping[str, int] = field(default_factory=dict)
    """Slots per pool that these settings name (the others keep `POOL_LIMITS` or what the instance holds)."""

    def environ(self) -> dict[str, str]:
        """The variables that carry these settings to a process this one starts (Dagster, a stage), which may run elsewhere."""
        env = {ROOT_ENV: str(self.root), DATA_ROOTS_ENV: os.pathsep.join(map(str, self.data_roots))}
        if self.benchmarks:
            env[BENCHMARKS_ENV] = ",".join(self.benchmarks)
        return env | {POOL_ENV_PREFIX + pool.upper(): str(slots) for pool, slots in self.pools.items()}


def load_settings(start: Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """The settings of the repository holding `start` (default: the current directory), the environment over its file."""
    environ = os.environ if environ is None else environ
    repository = repository_root(start if start is not None else Path.cwd())
    file = settings_file(repository)
    values = _parse(file, _stamp(file)) if file is not None else {}
    base = file.parent if file is not None else repository
    root = Path(environ[ROOT_ENV]).expanduser() if environ.get(ROOT_ENV, "").strip() else base / values.get("root", DEFAULT_ROOT)
    if environ.get(DATA_ROOTS_ENV, "").strip():
        roots = [Path(p).expanduser() for p in environ[DATA_ROOTS_ENV].split(os.pathsep) if p.strip()]
    else:
        roots = [base / Path(p).expanduser() for p in values.get("data_roots", ())] or [repository]
    benchmarks = values.get("benchmarks", ())
    if BENCHMARKS_ENV in environ:
        benchmarks = tuple(name.strip() for name in environ[BENCHMARKS_ENV].split(",") if name.strip())
    return Settings(repository=repository, file=file, root=root.resolve(), data_roots=tuple(r.resolve() for r in roots),
                    benchmarks=tuple(benchmarks), pools={**values.get("pools", {}), **_pools_of(environ)})


def settings_file(repository: Path) -> Path | None:
    """`factory.toml`, else a pyproject.toml with a `[tool.factory]` table, at the repository's root; None when neither."""
    toml = repository / SETTINGS_FILE
    if toml.is_file():
        return toml
    pyproject = repository / PYPROJECT
    if pyproject.is_file() and re.search(rb"^\s*\[\s*tool\.factory[\].]", read_bounded(pyproject), re.MULTILINE):
        return pyproject
    return None


def data_roots(start: Path | None = None) -> tuple[Path, ...]:
    """The directories directory sources may read under, for the repository holding `start` (default: the current directory)."""
    return load_settings(start).data_roots


def extends_roots(path: Path) -> tuple[Path, ...]:
    """Where a file that `path` extends may live: `path`'s repository, the repository the factory runs in, and the data roots."""
    return tuple(dict.fromkeys((repository_root(path.parent), repository_root(Path.cwd()), *data_roots(path.parent))))


def _stamp(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_mtime_ns, info.st_size


@lru_cache(maxsize=16)
def _parse(path: Path, stamp: tuple[int, int]) -> dict[str, Any]:
    """The file's settings, checked (parsed once per version of the file: `stamp` is its mtime and size)."""
    text = read_bounded(path).decode("utf-8", errors="replace")
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        line = m.group(1) if (m := _AT_LINE.search(str(e))) else "1"
        raise ConfigError(f"{path}:{line}: {_AT_LINE.sub('', str(e)).strip()}; fix the TOML") from e
    table: tuple[str, ...] = ("tool", "factory") if path.name == PYPROJECT else ()
    values: Any = document
    for key in table:
        values = values.get(key, {}) if isinstance(values, dict) else None
    if not isinstance(values, dict):
        raise ConfigError(f"{path}:{_line_of(text, (), table[0] if table else 'tool')}: [{'.'.join(table)}] must be a table")
    where = lambda key, inside=(): f"{path}:{_line_of(text, (*table, *inside), key)}: {'.'.join((*inside, key))}"  # noqa: E731
    for key in values:
        if key not in KEYS:
            raise ConfigError(f"{where(key)}: unknown setting; the settings are {', '.join(KEYS)}")
    checked: dict[str, Any] = {}
    if "root" in values:
        if not isinstance(values["root"], str) or not values["root"].strip():
            raise ConfigError(f"{where('root')}: a directory (a string such as \".factory\")")
        checked["root"] = values["root"]
    for key in ("data_roots", "benchmarks"):
        if key in values:
            if not isinstance(values[key], list) or not all(isinstance(v, str) and v.strip() for v in values[key]):
                raise ConfigError(f"{where(key)}: a list of strings, such as [\"{'../data' if key == 'data_roots' else 'mypkg.benchmarks'}\"]")
            checked[key] = tuple(values[key])
    pools = values.get("pools", {})
    if not isinstance(pools, dict):
        raise ConfigError(f"{where('pools')}: a table of slots per pool, such as [pools] training = 2")
    for pool, slots in pools.items():
        if pool not in POOL_LIMITS:
            raise ConfigError(f"{where(pool, ('pools',))}: unknown pool; the pools are {', '.join(POOL_LIMITS)}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 0:
            raise ConfigError(f"{where(pool, ('pools',))}: a pool's limit is a whole number of slots (0 stops it)")
    checked["pools"] = dict(pools)
    return checked


def _pools_of(environ: Mapping[str, str]) -> dict[str, int]:
    """The limits `FACTORY_POOL_<NAME>` sets."""
    limits = {}
    for pool in POOL_LIMITS:
        value = environ.get(POOL_ENV_PREFIX + pool.upper())
        if value is None:
            continue
        if not value.isdigit():
            raise ConfigError(f"{POOL_ENV_PREFIX}{pool.upper()}={value!r}: a pool's limit is a whole number of slots (0 stops it)")
        limits[pool] = int(value)
    return limits


def _line_of(text: str, table: tuple[str, ...], key: str) -> int:
    """The line where `key` is set in `table` (a `[header]`, or a dotted or inline key of the table above it), else 1."""
    current: tuple[str, ...] = ()
    header = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]")
    for number, line in enumerate(text.splitlines(), start=1):
        if m := header.match(line):
            current = tuple(part.strip().strip('"') for part in m.group(1).split("."))
            if current == (*table, key):
                return number
            continue
        assigned = re.match(r"^\s*\"?([A-Za-z0-9_.-]+?)\"?\s*=", line)
        if assigned:
            keys = (*current, *assigned.group(1).split("."))
            if keys[: len(table) + 1] == (*table, key) or (current == table[:-1] and keys == table):
                return number
    return 1
