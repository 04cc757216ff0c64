"""Where artifacts live: one `ObjectStore` protocol, a backend per URI scheme, and `open_store` to pick one.

A new backend (GCS, Azure) is a module with an `ObjectStore` subclass that has a `from_uri(uri, setting, patient)` classmethod,
and one entry in `BACKENDS`. Backends are imported when a store of their scheme is opened, so the local store never
loads an S3 client.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from factory.errors import ConfigError
from factory.storage.base import MAX_KEY_BYTES, Blob, ObjectStore, Stat, check_key, check_prefix

STORE_ENV = "FACTORY_STORE"
"""The setting that points the factory at its store: a directory, `file:///abs/dir` or `s3://bucket/prefix`."""
BACKENDS: dict[str, str] = {
    "file": "factory.storage.local:LocalStore",
    "s3": "factory.storage.s3:S3Store",
}
"""URI scheme -> `module:class` of its backend."""

__all__ = ["BACKENDS", "MAX_KEY_BYTES", "STORE_ENV", "Blob", "ObjectStore", "Stat", "check_key", "check_prefix", "in_object_store",
           "open_store", "table_properties"]


def in_object_store(location: str) -> bool:
    """Whether `location` names an object store (`scheme://...`), not a local directory (a plain path or `file://`)."""
    scheme, separator, _ = location.partition("://")
    return bool(separator) and scheme != "file"


def table_properties(location: str) -> dict[str, str]:
    """What pyiceberg's file IO needs for a warehouse at `location` (a local directory or `file://`: nothing), from the
    backend of its scheme (`ObjectStore.table_properties`): a new backend brings its own, no edit elsewhere."""
    if not in_object_store(location):
        return {}
    return _backend(location.partition("://")[0], location, STORE_ENV).table_properties(location)


def _backend(scheme: str, location: str, setting: str) -> type[ObjectStore]:
    """The class of `scheme`'s backend; ConfigError naming `setting` for a scheme no backend has."""
    if scheme not in BACKENDS:
        known = ", ".join(f"{name}://" for name in BACKENDS)
        raise ConfigError(f"{setting}={location}: unknown scheme {scheme}://; the stores known are {known} (or a local directory)")
    module, _, name = BACKENDS[scheme].partition(":")
    return getattr(importlib.import_module(module), name)


def open_store(location: str | Path, *, setting: str = STORE_ENV, patient: bool = False) -> ObjectStore:
    """The store at `location`: a local directory (a plain path or `file://`), or a URI of a scheme in `BACKENDS`.

    A location that cannot be used (an unknown scheme; for S3, a missing bucket, an unreachable endpoint, refused
    credentials) is a ConfigError naming `setting`, the setting the location came from, raised here, before any work.
    `patient`: an endpoint that does not answer is waited for as an open store waits out an outage, not refused at once
    (a stage process of a run whose store was checked when the run began: the endpoint has gone away since)."""
    text = str(location)
    scheme, separator, _ = text.partition("://")
    if not separator:
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]+:", text):
            raise ConfigError(f"{setting}={text}: a store is a directory or a URI written scheme://... (a directory whose "
                              f"name has a colon: ./{text})")
        from factory.storage.local import LocalStore

        return LocalStore(text)
    return _backend(scheme, text, setting).from_uri(text, setting, patient)
