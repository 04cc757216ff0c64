"""The leaderboard: one row per experiment from its latest evaluation, rendered as Markdown."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from factory.registry.store import Manifest


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    """One experiment's standing."""

    experiment: str
    bpb: float
    init_bpb: float
    parameters: int
    tokens_seen: int
    git_commit: str
    digest: str

    def to_json(self) -> dict:
        """Plain JSON form."""
        return {name: getattr(self, name) for name in self.__slots__}


def build_rows(evaluations: Iterable[tuple[str, Manifest]]) -> list[Row]:
    """Rows from (experiment, evaluation manifest) pairs, best (lowest bits-per-byte) first."""
    rows = [
        Row(
            experiment=experiment,
            bpb=manifest.summary["bpb"],
            init_bpb=manifest.summary["init_bpb"],
            parameters=manifest.summary["parameters"],
            tokens_seen=manifest.summary["tokens_seen"],
            git_commit=manifest.git_commit,
            digest=manifest.digest,
        )
        for experiment, manifest in evaluations
    ]
    return sorted(rows, key=lambda row: (row.bpb, row.experiment))


def render_markdown(rows: Iterable[Row]) -> str:
    """A Markdown table of the rows, in their order."""
    lines = [
        "| rank | experiment | val bits/byte | untrained bits/byte | parameters | tokens seen | commit | evaluation |",
        "|---:|---|---:|---:|---:|---:|---|---|",
    ]
    for rank, row in enumerate(rows, start=1):
        lines.append(
            f"| {rank} | {row.experiment} | {row.bpb:.4f} | {row.init_bpb:.4f} | {row.parameters:,} | "
            f"{row.tokens_seen:,} | {_short_commit(row.git_commit)} | {row.digest[:12]} |"
        )
    if len(lines) == 2:
        lines.append("| | no evaluations yet | | | | | | |")
    return "\n".join(lines)


def _short_commit(commit: str) -> str:
    return commit[:12] + ("-dirty" if commit.endswith("-dirty") else "")
