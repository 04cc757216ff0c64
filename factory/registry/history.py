"""Append-only records in the registry: reproductions of a model, promotions of a model to an alias.

A topic (`reproductions/<model digest>`, `promotions/production`) is a directory of numbered JSON
records. A record is written to a temp file and linked into place under the next free number, so
it appears whole or not at all, is never overwritten, and two writers never take the same number.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from factory.atomic import synced_temp
from factory.errors import ArtifactError, ConfigError
from factory.registry.files import load_record

TOPIC = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
RECORD = re.compile(r"^(\d{6})\.json$")


def checked_topic(topic: str) -> str:
    """`topic` if it names a history (letters, digits, '_', '.', '-' and '/', no `..`); else a ConfigError."""
    if not TOPIC.match(topic) or any(part in (".", "..") for part in topic.split("/")):
        raise ConfigError(f"{topic!r} is not a history topic: use letters, digits, '_', '.', '-' and '/'")
    return topic


def parse_record(data: Any, where: str) -> dict[str, Any]:
    """A history record parsed from JSON; an ArtifactError naming `where` when it is not an object."""
    if not isinstance(data, dict):
        raise ArtifactError(f"history record {where} is damaged (not a JSON object); restore it from a backup, or remove "
                            "it and the records after it to forget them")
    return data


class History:
    """The records of one topic, oldest first."""

    def __init__(self, root: str | Path, topic: str) -> None:
        self.path = Path(root) / "history" / checked_topic(topic)

    def records(self) -> list[dict[str, Any]]:
        """Every record, oldest first, each with its `seq`."""
        if not self.path.is_dir():
            return []
        found = sorted((int(m.group(1)), p) for p in self.path.iterdir() if (m := RECORD.match(p.name)))
        return [{**_read(path), "seq": seq} for seq, path in found]

    def append(self, record: Mapping[str, Any]) -> int:
        """Add a record under the next number; that number."""
        self.path.mkdir(parents=True, exist_ok=True)
        text = json.dumps(dict(record), indent=2, sort_keys=True)
        with synced_temp(self.path / "record", text) as tmp:  # named for no record: its number is taken below
            while True:
                seq = max((int(m.group(1)) for p in self.path.iterdir() if (m := RECORD.match(p.name))), default=0) + 1
                try:
                    os.link(tmp, self.path / f"{seq:06d}.json")  # fails if another writer took the number
                    return seq
                except FileExistsError:
                    continue


def _read(path: Path) -> dict[str, Any]:
    """One record; an ArtifactError naming it when it is damaged (a history is never read past a record it lost)."""
    try:
        return parse_record(load_record(path), str(path))
    except (OSError, ValueError) as e:
        raise ArtifactError(f"history record {path} is damaged ({e}); restore it from a backup, or remove it and the "
                            "records after it to forget them") from e
