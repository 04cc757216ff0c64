"""How a cell appears in a table of rows (the table view, a diff, SQL results): short, and as text."""

from __future__ import annotations

import datetime
import decimal
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Preview:
    """The first characters of a cell shown as text, and the length of all of it."""

    text: str
    length: int

    @property
    def cut(self) -> bool:
        """Whether characters were left out."""
        return self.length > len(self.text)


def preview(value: Any, chars: int) -> Any:
    """None, a bool or a number as it is; anything else as a Preview of its text, cut to `chars`."""
    if value is None or isinstance(value, bool | int | float | decimal.Decimal):
        return value
    text = as_text(value)
    return Preview(text[:chars], len(text))


def as_text(value: Any) -> str:
    """A cell as text: bytes decoded (bad bytes replaced), lists and structs as JSON, the rest by str()."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, ensure_ascii=False, default=str)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    return str(value)
