"""Shared data fixtures: a real sqlite-backed Iceberg catalog and small document tables."""

import dataclasses
import hashlib
import json
import logging

import pyarrow as pa
import pytest

from factory.config.data_sections import SourceConfig
from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.documents import ARROW_SCHEMA, doc_id, document_schemas
from factory.data.ingest import IngestResult, read_documents

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


def ingest(name: str, source: SourceConfig, log=LOG) -> IngestResult:
    """`read_documents` with its rows gathered into one table (in the order a pass gives them, which is by id)."""
    with read_documents(name, source, log) as result:
        table = pa.Table.from_batches(list(result.documents.batches()), schema=pa.schema(document_schemas(source.columns)[0]))
    assert table.select(["id", "sha256", "bytes"]).equals(result.documents.keys) and table["id"].to_pylist() == sorted(table["id"].to_pylist())
    return dataclasses.replace(result, documents=table)
