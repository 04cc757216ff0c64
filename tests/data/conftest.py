"""Shared data fixtures: a real sqlite-backed Iceberg catalog and small document tables."""

import hashlib
import json
import logging

import pyarrow as pa
import pytest

from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.documents import ARROW_SCHEMA, doc_id

LOG = logging.getLogger("test.data")


@pytest.fixture
def catalog(tmp_path):
    return open_catalog(CatalogConfig.local(tmp_path / "catalog"))


def documents(source: str, texts: dict[str, str]) -> pa.Table:
    """A document table from {path: text}."""
    rows = {name: [] for name in ARROW_SCHEMA.names}
    for path, text in texts.items():
        data = text.encode()
        rows["id"].append(doc_id(source, path))
        rows["source"].append(source)
        rows["path"].append(path)
        rows["text"].append(text)
        rows["bytes"].append(len(data))
        rows["sha256"].append(hashlib.sha256(data).hexdigest())
        rows["metadata"].append(json.dumps({}))
    return pa.Table.from_pydict(rows, schema=ARROW_SCHEMA)
