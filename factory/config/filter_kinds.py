"""Document filters written by users: a Python function over one document, registered by an installed package, run by
the filtered stage after the built-in filters (`data.datasets.<name>.filters.custom`), on the data engine's workers.

An installed package adds a filter through the entry-point group `model_factory.filters`, each entry point naming a
`DocumentFilter` (`examples/doc-filters`). Its function gets the document as a mapping (`id`, `source`, `path`, `text`,
`bytes`, `sha256`, `metadata`) and says whether to keep it; it must be a function of the document alone (it runs in other
processes, on any worker, in any order). Its package's code enters the filtered stage's fingerprint: editing it
filters again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from factory.config.plugins import load_declarations, plugin_name, unknown
from factory.errors import PluginError

ENTRY_POINT_GROUP = "model_factory.filters"
BUILT_IN_FILTERS = ("min_bytes", "max_bytes", "max_line_length", "min_alnum_share", "generated", "license_only")
"""The names the built-in filters count their removals under (`factory.data.filters`): no plugin may take one."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DocumentFilter:
    """A filter a plugin declares: `keep(document)` is True for a document that stays."""

    name: str
    keep: Callable[[Mapping[str, Any]], bool]
    description: str = ""
    origin: str = ""
    """The plugin that declared it (set when it is registered)."""


@functools.cache
def document_filters() -> dict[str, DocumentFilter]:
    """Every registered filter by name."""
    found: dict[str, DocumentFilter] = {}
    for entry, declared in load_declarations(ENTRY_POINT_GROUP, DocumentFilter, "filter"):
        if declared.name in BUILT_IN_FILTERS or declared.name in found:
            clash = "a built-in filter" if declared.name in BUILT_IN_FILTERS else found[declared.name].origin
            raise PluginError(f"{plugin_name(entry)} declares the filter {declared.name!r}, which {clash} takes already; rename it")
        if not callable(declared.keep):
            raise PluginError(f"{plugin_name(entry)}: the filter {declared.name!r} has a `keep` of {declared.keep!r}, not a function")
        found[declared.name] = DocumentFilter(name=declared.name, keep=declared.keep, description=declared.description,
                                              origin=plugin_name(entry))
    return found


def document_filter(name: str) -> DocumentFilter:
    """The filter named `name`; a ConfigError listing the known ones otherwise."""
    filters = document_filters()
    if name not in filters:
        raise unknown(ENTRY_POINT_GROUP, "filter", name, filters)
    return filters[name]
