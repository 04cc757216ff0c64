"""The one document schema every dataset table shares, and the deterministic train/validation split."""

from __future__ import annotations

import hashlib

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

SPLITS = ("train", "validation")
COLUMNS = ("id", "source", "path", "text", "bytes", "sha256", "metadata")
SCHEMA = Schema(
    NestedField(1, "id", StringType(), required=True),
    NestedField(2, "source", StringType(), required=True),
    NestedField(3, "path", StringType(), required=True),
    NestedField(4, "text", StringType(), required=True),
    NestedField(5, "bytes", LongType(), required=True),
    NestedField(6, "sha256", StringType(), required=True),
    NestedField(7, "metadata", StringType(), required=True),
)
ARROW_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("text", pa.large_string(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("metadata", pa.string(), nullable=False),
    ]
)


def doc_id(source: str, path: str) -> str:
    """Stable id of a document: where it came from, not what it holds (32 hex digits)."""
    return hashlib.sha256(f"{source}\0{path}".encode()).hexdigest()[:32]


def split_of(doc_id_: str, validation_percent: int) -> str:
    """Deterministic split by the document id: the same document always lands in the same split."""
    return "validation" if int(doc_id_[:8], 16) % 100 < validation_percent else "train"


def empty_documents() -> pa.Table:
    """A table with the document schema and no rows."""
    return ARROW_SCHEMA.empty_table()
