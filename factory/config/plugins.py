"""Loading what installed packages declare through an entry-point group: each entry point names one declaration object
(a `StageKind`, a `SourceKind`, ...). Whatever cannot be loaded is a `PluginError` that names the plugin and its package
and says what to change; nothing of a broken plugin is used."""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import TypeVar

from factory.errors import ConfigError

T = TypeVar("T")


class PluginError(ConfigError):
    """A plugin that cannot be registered; the message names the plugin and what to change."""


def who(entry: EntryPoint) -> str:
    """How a plugin is named in messages: its entry point, what it points at and its package."""
    package = f" of package {entry.dist.name}" if entry.dist is not None else ""
    return f"plugin {entry.name!r} ({entry.value}{package})"


def load_declarations(group: str, declared: type[T]) -> list[tuple[EntryPoint, T]]:
    """Every entry point of `group`, by name, loaded: each must name a `declared` whose `name` is the entry point's."""
    found = []
    for entry in sorted(entry_points(group=group), key=lambda e: e.name):
        try:
            value = entry.load()
        except Exception as e:  # a plugin's import can fail in any way; say which and go no further
            raise PluginError(f"{who(entry)} failed to import ({type(e).__name__}: {e}); fix the package or uninstall it") from e
        if not isinstance(value, declared):
            raise PluginError(f"{who(entry)} names a {type(value).__name__}, not a {declared.__name__}; point the entry point "
                              f"at the `{declared.__name__}(...)` object")
        if getattr(value, "name", None) != entry.name:
            raise PluginError(f"{who(entry)} declares {declared.__name__} {getattr(value, 'name', None)!r}: name the entry point "
                              "after what it declares")
        found.append((entry, value))
    return found
