"""Links into Podium, for Dagster's metadata: a table version's page, a checkpoint's generate page.

The address is `$FACTORY_PODIUM_URL` (default http://127.0.0.1:8765, where `factory podium`
listens); a team that serves Podium elsewhere sets it for the code location.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from typing import Any

URL_ENV = "FACTORY_PODIUM_URL"
DEFAULT_URL = "http://127.0.0.1:8765"


def base_url() -> str:
    """Where Podium is served, without a trailing slash."""
    return (os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")


def table_url(table: str, snapshot: str | int | None = None) -> str:
    """The page of `namespace.table`, at a snapshot id or tag when given."""
    path = f"{base_url()}/t/{urllib.parse.quote(table, safe='.')}"
    return f"{path}?{urllib.parse.urlencode({'snapshot': snapshot})}" if snapshot is not None else path


def ref_url(ref: str) -> str:
    """The page of a pinned version, `namespace.table@tag`."""
    table, _, tag = ref.partition("@")
    return table_url(table, tag or None)


def checkpoint_url(sha256: str) -> str:
    """The generate page with this checkpoint (or exported model) chosen."""
    return f"{base_url()}/checkpoint/{sha256}"


def table_links(summary: Mapping[str, Any]) -> dict[str, str]:
    """`podium/<dataset>` links for every `<dataset>/table` version a data stage's summary names."""
    return {
        f"podium/{key.removesuffix('/table')}": ref_url(value)
        for key, value in sorted(summary.items())
        if key.endswith("/table") and isinstance(value, str) and "@" in value
    }
