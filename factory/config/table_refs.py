"""Pinned table versions as experiment files name them (`namespace.table@tag`), and the columns of a dataset table."""

from __future__ import annotations

import re

TABLE_PART = re.compile(r"^[a-z_][a-z0-9_]*$")
TAG_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DOCUMENT_COLUMNS = ("id", "source", "path", "text", "bytes", "sha256", "metadata")
"""The columns of every dataset table (`factory.data.documents`), ahead of the columns a source keeps."""


def table_ref(value: str) -> str:
    """A pinned table version `namespace.table@tag`, or a ValueError saying what was expected."""
    name, _, tag = value.partition("@")
    parts = name.split(".")
    if len(parts) != 2 or not all(TABLE_PART.fullmatch(p) for p in parts) or not TAG_PATTERN.fullmatch(tag):
        raise ValueError(f"expected 'namespace.table@tag' (lower_snake_case names, a tag), found {value!r}")
    return value
