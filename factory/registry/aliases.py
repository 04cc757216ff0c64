"""Promotion aliases (`production`): each names a model through an append-only history of promotions and demotions.

The history of an alias is `history/promotions/<alias>` in the registry (on disk or in the object store): a promotion pushes a model, a demotion goes
back to the model named before. What an alias names now is read from the whole history (`standing`); writing it is
`factory.ops.promote`'s, which checks what allows a promotion first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from factory.errors import ConfigError

if TYPE_CHECKING:
    from factory.registry.seam import Records, Registry

ALIAS = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
"""An alias's name."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Standing:
    """What an alias names now, and its history."""

    alias: str
    model: str | None
    records: list[dict[str, Any]]

    @property
    def promotion(self) -> dict[str, Any] | None:
        """The promotion record of the model the alias names now."""
        return next((r for r in reversed(self.records) if r["action"] == "promote" and r["model"] == self.model), None)


def history(registry: Registry, alias: str) -> Records:
    """The append-only history of an alias, in `registry`."""
    if not ALIAS.match(alias):
        raise ConfigError(f"{alias!r} is not an alias name: lower-case letters, digits, '_' and '-' (e.g. production)")
    return registry.history(f"promotions/{alias}")


def standing(registry: Registry, alias: str) -> Standing:
    """The model an alias names after its whole history (promotions push, demotions pop)."""
    records = history(registry, alias).records()
    stack: list[str] = []
    for record in records:
        if record["action"] == "promote":
            stack.append(record["model"])
        elif stack:
            stack.pop()
    return Standing(alias=alias, model=stack[-1] if stack else None, records=records)


def known_aliases(registry: Registry) -> list[str]:
    """Every alias `registry` has a history for."""
    return [name for name in registry.topics("promotions") if ALIAS.match(name)]
