"""Source kinds: where a dataset's raw files come from (`data.datasets.<name>.source.kind`), built in or from a plugin.

A `SourceKind` names a directory of files; the source's `include`/`exclude` globs pick the files in it, which the
raw stage lists (their digest enters its fingerprint) and reads (as text or JSON lines). The built-in kinds are the
running interpreter's standard library, its site-packages, and a directory the file names (`path`, under the data
roots). An installed package adds a kind through the entry-point group `model_factory.sources`, each entry point
naming a `SourceKind`: e.g. a team's shared corpus mounted at a fixed place, or a tool's cache directory.
"""

from __future__ import annotations

import functools
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from factory.config.plugins import load_declarations, plugin_name
from factory.errors import ConfigError, PluginError

ENTRY_POINT_GROUP = "model_factory.sources"
BUILT_IN = "built in"


@dataclass(frozen=True, kw_only=True)
class SourceKind:
    """One kind of source: the directory its files are read from."""

    name: str
    """What `source.kind` says."""
    description: str
    """What it reads, shown in `factory check`'s errors and the reference."""
    root: Callable[[Any], Path]
    """The directory to read, given the source's config (a `SourceConfig`)."""
    takes_path: bool = False
    """Whether `source.path` names the directory (then required, and only directories under the data roots are read)."""
    skip_dirs: frozenset[str] = frozenset()
    """Directories never walked into (caches are always skipped)."""
    origin: str = BUILT_IN
    """Who declared it: `built in`, or the plugin's entry point and package (set by the registry)."""


def _path(config: Any) -> Path:
    assert config.path is not None, "a source that takes a path has one (SourceConfig validates it)"
    return Path(config.path)


BUILTIN_SOURCES = (
    SourceKind(name="python-stdlib", description="the running interpreter's standard library",
               root=lambda config: Path(sysconfig.get_paths()["stdlib"]), skip_dirs=frozenset({"site-packages", "dist-packages"})),
    SourceKind(name="site-packages", description="the running interpreter's installed packages",
               root=lambda config: Path(sysconfig.get_paths()["purelib"])),
    SourceKind(name="directory", description="a directory, named by `path`", root=_path, takes_path=True),
)


@functools.cache
def source_kinds() -> dict[str, SourceKind]:
    """Every registered source kind by name: the built-in ones, then the plugins'."""
    kinds = {kind.name: kind for kind in BUILTIN_SOURCES}
    for entry, declared in load_declarations(ENTRY_POINT_GROUP, SourceKind, "source kind"):
        if (clash := kinds.get(declared.name)) is not None:
            raise PluginError(f"{plugin_name(entry)} declares the source kind {declared.name!r}, which {clash.origin} declares already; "
                              "rename one of them")
        kinds[declared.name] = SourceKind(**{**declared.__dict__, "origin": plugin_name(entry)})
    return kinds


def source_kind(name: str) -> SourceKind:
    """The source kind named `name`; a ConfigError listing the known ones otherwise. A built-in kind is found without
    loading the plugins (the schema's defaults are built when it is imported)."""
    for kind in BUILTIN_SOURCES:
        if kind.name == name:
            return kind
    kinds = source_kinds()
    if name not in kinds:
        raise ConfigError(f"unknown source kind {name!r}; known: {', '.join(kinds)} (a plugin package adds others)")
    return kinds[name]
