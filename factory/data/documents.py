"""The document schema every dataset table shares (and the record columns a source may keep), and the deterministic
train/validation split."""

from __future__ import annotations

import hashlib

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from factory.config.table_refs import DOCUMENT_COLUMNS

SPLITS = ("train", "validation")
COLUMNS = DOCUMENT_COLUMNS
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


def document_schemas(kept: tuple[str, ...] = ()) -> tuple[pa.Schema, Schema]:
    """The Arrow and Iceberg schemas of a dataset table: the document columns, then the record columns a source keeps
    (required text: turns are stored as their JSON)."""
    if not kept:
        return ARROW_SCHEMA, SCHEMA
    extra = [pa.field(name, pa.large_string(), nullable=False) for name in kept]
    fields = [NestedField(len(COLUMNS) + i, name, StringType(), required=True) for i, name in enumerate(kept, start=1)]
    return pa.schema([*ARROW_SCHEMA, *extra]), Schema(*SCHEMA.fields, *fields)


def kept_columns(names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The columns of a dataset table beyond the document's own: the record columns its source keeps."""
    return tuple(name for name in names if name not in COLUMNS)


def doc_id(source: str, path: str) -> str:
    """Stable id of a document: where it came from, not what it holds (32 hex digits)."""
    return hashlib.sha256(f"{source}\0{path}".encode()).hexdigest()[:32]


def split_of(doc_id_: str, validation_percent: int) -> str:
    """Deterministic split by the document id: the same document always lands in the same split."""
    return "validation" if int(doc_id_[:8], 16) % 100 < validation_percent else "train"


def empty_documents() -> pa.Table:
    """A table with the document schema and no rows."""
    return ARROW_SCHEMA.empty_table()
