"""Publish a leaderboard as an immutable artifact, and find the newest one."""

from __future__ import annotations

import json
from collections.abc import Sequence

from factory.config.fingerprint import code_identity, sha256_of
from factory.evals.leaderboard import Row, render_markdown
from factory.registry.store import ArtifactStore, Manifest, Provenance

KIND = "leaderboard"
ROWS_FILE = "leaderboard.json"
MARKDOWN_FILE = "leaderboard.md"


def publish_leaderboard(registry: ArtifactStore, rows: Sequence[Row], commit: str) -> tuple[Manifest, str]:
    """Publish the rows (JSON and Markdown); the same evaluations give the same artifact."""
    inputs = {row.experiment: row.digest for row in rows}
    code = code_identity("local")
    fingerprint = sha256_of({"kind": KIND, "inputs": inputs, "code": code})
    markdown = render_markdown(rows)
    manifest = registry.lookup(fingerprint)
    if manifest is None:
        with registry.staging() as out:
            (out / ROWS_FILE).write_text(json.dumps([row.to_json() for row in rows], indent=2))
            (out / MARKDOWN_FILE).write_text(markdown + "\n")
            manifest = registry.publish(
                out,
                kind=KIND,
                fingerprint=fingerprint,
                config={},
                inputs=inputs,
                code=code,
                provenance=Provenance(experiment="*", config_hash=sha256_of(inputs)[:16], git_commit=commit),
                summary={"experiments": len(rows), "best": rows[0].experiment if rows else ""},
            )
    registry.set_ref(KIND, manifest.digest)  # the newest leaderboard, even when it was reused
    return manifest, markdown


def latest_leaderboard(registry: ArtifactStore) -> str | None:
    """Markdown of the most recently materialized leaderboard, or None."""
    digest = registry.ref(KIND)
    return None if digest is None else (registry.open(digest) / MARKDOWN_FILE).read_text()
