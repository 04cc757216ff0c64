"""Loading the declarations installed packages make through entry-point groups (`model_factory.stages`, `.sources`,
`.models`), the same way for every registry: each entry point names one declaration object, named after it.
Whatever cannot be loaded is a `PluginError` naming the plugin and its package and saying what to change."""

from __future__ import annotations

import functools
import importlib
import tomllib
from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint, EntryPoints, entry_points
from pathlib import Path
from typing import Any, TypeVar

from factory.errors import ConfigError, PluginError

Declaration = TypeVar("Declaration")


def plugin_name(entry: EntryPoint) -> str:
    """How errors name a plugin: its entry point, what it points at, and the package that declares it."""
    package = f" of package {entry.dist.name}" if entry.dist is not None else ""
    return f"plugin {entry.name!r} ({entry.value}{package})"


def load_declaration(entry: EntryPoint, declared: type[Declaration], noun: str) -> Declaration:
    """The `declared` object `entry` names, named after it; a PluginError naming the plugin otherwise."""
    who = plugin_name(entry)
    try:
        value = entry.load()
    except Exception as e:  # a plugin's import can fail in any way; say which and go no further
        raise PluginError(f"{who} failed to import ({type(e).__name__}: {e}); fix the package or uninstall it") from e
    if not isinstance(value, declared):
        raise PluginError(f"{who} names a {type(value).__name__}, not a {declared.__name__}; point the entry point at the "
                          f"{noun}'s `{declared.__name__}(...)` object")
    if value.name != entry.name:
        raise PluginError(f"{who} declares the {noun} {value.name!r}: name the entry point after the {noun} it declares")
    return value


def load_declarations(group: str, declared: type[Declaration], noun: str) -> list[tuple[EntryPoint, Declaration]]:
    """Every entry point of `group`, by name, with the declaration it names."""
    return [(entry, load_declaration(entry, declared, noun)) for entry in entry_points_of(group)]


def entry_points_of(group: str) -> list[EntryPoint]:
    """The installed entry points of `group`, sorted by name."""
    return sorted(_installed().select(group=group), key=lambda e: e.name)


@functools.cache
def _installed() -> EntryPoints:
    """Every installed entry point, read once per process: a look-up by group reads every installed package's metadata
    again, and the stage, source and model registries each look up their own group."""
    return entry_points()


def example_declaring(group: str, name: str) -> str | None:
    """The package of this checkout's `examples/` that declares `name` in the entry-point group `group`, as the directory
    to install (`examples/git-source`); None when none does."""
    examples = Path(__file__).resolve().parents[2] / "examples"
    for pyproject in sorted(examples.glob("*/pyproject.toml")) if examples.is_dir() else []:
        try:
            project = tomllib.loads(pyproject.read_text()).get("project", {})
        except (OSError, tomllib.TOMLDecodeError):
            continue
        if name in project.get("entry-points", {}).get(group, {}):
            return pyproject.parent.relative_to(examples.parent).as_posix()
    return None


def unknown(group: str, noun: str, name: str, known: Iterable[str]) -> ConfigError:
    """The error for a name no registered `noun` of `group` has: the known ones, and the example package of this checkout
    that declares it, when one does."""
    package = example_declaring(group, name)
    install = f"install the package that declares it: pip install -e {package}" if package else "a plugin package adds others"
    return ConfigError(f"unknown {noun} {name!r}; known: {', '.join(known) or 'none'} ({install})")


def resolve(function: str | Callable[..., Any]) -> Callable[..., Any]:
    """A declaration's function, imported now when named as `module:function`."""
    if callable(function):
        return function
    module, _, name = function.partition(":")
    return getattr(importlib.import_module(module), name)
