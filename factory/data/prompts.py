"""Custom prompts saved from Podium: the Iceberg table `podium.custom_prompts`, one version per save.

Saves append, so two people saving at once both keep their prompt. After its append, a save tags
the table's current snapshot `v<n>` (or reuses its tag when another save tagged it first): the
current snapshot holds every prompt appended so far, so each version holds all the ones before
it. An evaluation pins a version like any dataset (`podium.custom_prompts@v3`).
"""

from __future__ import annotations

import datetime
import hashlib

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from factory.data.tables import CONFLICTS, VERSION_TAG, ensure_namespace, next_version, resolve
from factory.errors import ArtifactError, ConfigError

TABLE = "podium.custom_prompts"
MAX_PROMPT_CHARS = 20_000
MAX_NOTE_CHARS = 2_000
COMMIT_ATTEMPTS = 10
SCHEMA = Schema(
    NestedField(1, "id", StringType(), required=True),
    NestedField(2, "prompt", StringType(), required=True),
    NestedField(3, "note", StringType(), required=True),
    NestedField(4, "source", StringType(), required=True),
    NestedField(5, "created", StringType(), required=True),
    NestedField(6, "bytes", LongType(), required=True),
    NestedField(7, "sha256", StringType(), required=True),
)
ARROW_SCHEMA = pa.schema([pa.field(f.name, pa.int64() if f.name == "bytes" else pa.string(), nullable=False) for f in SCHEMA.fields])


def save_prompt(catalog: Catalog, prompt: str, note: str, source: str = "") -> str:
    """Append one prompt (with why it matters and where it came from); the `v<n>` tag of the new version."""
    if not prompt.strip():
        raise ConfigError("the prompt is empty: write one before saving")
    if len(prompt) > MAX_PROMPT_CHARS or len(note) > MAX_NOTE_CHARS:
        raise ConfigError(f"a prompt may have {MAX_PROMPT_CHARS} characters and a note {MAX_NOTE_CHARS}")
    created = datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")
    sha = hashlib.sha256(prompt.encode()).hexdigest()
    row = {"id": hashlib.sha256(f"{created}\0{sha}\0{note}".encode()).hexdigest()[:32], "prompt": prompt, "note": note,
           "source": source, "created": created, "bytes": len(prompt.encode()), "sha256": sha}
    ensure_namespace(catalog, TABLE.split(".")[0])
    table = catalog.create_table_if_not_exists(TABLE, schema=SCHEMA)
    appended = False
    for _ in range(COMMIT_ATTEMPTS):
        try:
            if not appended:
                table.append(pa.Table.from_pylist([row], schema=ARROW_SCHEMA))
                appended = True
            table.refresh()
            current = table.current_snapshot()
            assert current is not None, "an append always makes a snapshot"
            if taken := [n for n, r in table.refs().items() if r.snapshot_id == current.snapshot_id and VERSION_TAG.match(n)]:
                return taken[0]
            tag = f"v{next_version(table)}"  # another save may take this number first: then the next one
            table.manage_snapshots().create_tag(current.snapshot_id, tag).commit()
            return tag
        except CONFLICTS:
            table = catalog.load_table(TABLE)
    raise ArtifactError(f"{TABLE}: {COMMIT_ATTEMPTS} saves in a row lost to concurrent writers; save again")


def read_prompts(catalog: Catalog, tag: str) -> list[dict[str, str]]:
    """The prompts of one version (`v<n>`), oldest first: what an evaluation pinned to that tag reads."""
    snapshot = resolve(catalog, TABLE, tag)
    rows = catalog.load_table(TABLE).scan(snapshot_id=snapshot).to_arrow().sort_by("created").to_pylist()
    return [{"id": r["id"], "prompt": r["prompt"], "note": r["note"], "source": r["source"]} for r in rows]
