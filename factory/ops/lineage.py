"""Lineage from the registry's manifests: what an artifact or a table version came from, and what came of it.

Every manifest names its inputs by digest, so artifacts form a graph. Table versions join it
through the stage kinds that write them (`writes_tables`: the data stages record the versions they
wrote in `datasets.json`), the blend (the versions it draws from), and post-training stages (the
task table they pin). The answers are the ones the Dagster UI gives, read from the registry alone:
which models were trained on a dataset version, and which data and code made a model.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from factory.config import stages
from factory.config.kinds import BLEND, main_training_kind, model_kind, provider
from factory.config.stages import BASE, FROM_HF
from factory.errors import ArtifactError, ConfigError
from factory.registry.index import ByDigest, Where
from factory.registry.layout import BLEND_FILE, DATASETS_FILE
from factory.registry.seam import Registry
from factory.registry.store import Manifest

REPORTS = ("run_report",)
"""Kinds that describe a run rather than take part in lineage: left out of the trees."""
HEX = re.compile(r"^[0-9a-f]{6,64}$")
TABLE = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")


@dataclass(frozen=True, kw_only=True, slots=True)
class TableVersion:
    """A version of an Iceberg table as a manifest names it."""

    table: str
    tag: str
    """The human tag (`v1`, or the name a config gave)."""
    content_tag: str

    @property
    def ref(self) -> str:
        """`namespace.table@tag`."""
        return f"{self.table}@{self.tag}"

    def matches(self, table: str, tag: str | None) -> bool:
        """Whether `table[@tag]` names this version (by its tag or its content tag)."""
        return self.table == table and tag in (None, self.tag, self.content_tag)


class Lineage:
    """The registry's artifacts as a graph, with the table versions between them. Read as the questions walk it: each
    artifact, and what was made from each, is one query of the registry's index (never every manifest), kept for the
    rest of the walk; the table versions are read once, from the data stages' artifacts, when a question needs them."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.manifests = ByDigest(registry, skip=REPORTS)
        self._children: dict[str, list[str]] = {}
        self._written_by: dict[str, list[TableVersion]] = {}

    @functools.cached_property
    def written(self) -> dict[str, list[TableVersion]]:
        """Data-stage artifact digest -> the table versions it wrote: every data stage's (what a table's question needs)."""
        return {m.digest: self.written_by(m) for kind in sorted(stages.DATA_STAGES) for m in self.registry.manifests(kind)}

    def written_by(self, manifest: Manifest) -> list[TableVersion]:
        """The table versions one artifact wrote (none unless a data stage's), read once."""
        if manifest.kind not in stages.DATA_STAGES:
            return []
        if manifest.digest not in self._written_by:
            self._written_by[manifest.digest] = self._written(manifest)
        return self._written_by[manifest.digest]

    def children(self, digest: str) -> list[str]:
        """The digests of the artifacts made straight from this one."""
        if digest not in self._children:
            made = {m.digest: m for m in self.registry.manifests(where=Where(made_from=digest)) if m.kind not in REPORTS}
            for manifest in made.values():
                self.manifests.remember(manifest)
            self._children[digest] = list(made)
        return self._children[digest]

    def find(self, query: str) -> list[Manifest] | list[TableVersion]:
        """The artifacts a digest (prefix) or experiment names, or the table versions `namespace.table[@tag]` names."""
        table, _, tag = query.partition("@")
        if TABLE.match(table) and not HEX.match(query):
            versions = {v for written in self.written.values() for v in written if v.matches(table, tag or None)}
            if not versions:
                known = sorted({v.ref for written in self.written.values() for v in written if v.table == table})
                raise ConfigError(f"no artifact in the registry wrote {query}" + (f"; versions written: {', '.join(known)}" if known else ""))
            return sorted(versions, key=lambda v: v.ref)
        where = Where(digest_prefix=query) if HEX.match(query) else Where(experiment=query)  # an experiment: its models
        kind = None if HEX.match(query) else model_kind().name
        found = list({m.digest: m for m in self.registry.manifests(kind, where) if m.kind not in REPORTS}.values())
        if not found:
            raise ConfigError(f"nothing in the registry is {query!r}: give an artifact digest (or its first 12 digits), "
                              "an experiment name with a model, or namespace.table[@tag]")
        for manifest in found:
            self.manifests.remember(manifest)
        return sorted(found, key=lambda m: m.created)

    def writers(self, version: TableVersion) -> list[Manifest]:
        """The data-stage artifacts that wrote a table version."""
        return [self.manifests[d] for d, written in self.written.items() if version in written]

    def upstream(self, digest: str) -> dict[str, Any]:
        """The artifact and everything it was made from, as a tree of plain dicts."""
        return self._tree(digest, lambda m: [d for d in m.inputs.values() if d in self.manifests], set(), with_tables=True)

    def downstream(self, digest: str) -> dict[str, Any]:
        """The artifact and everything made from it, as a tree of plain dicts."""
        return self._tree(digest, lambda m: self.children(m.digest), set(), with_tables=False)

    def descendants(self, digest: str, kind: str | None = None) -> list[Manifest]:
        """Every artifact made (directly or not) from this one, of one kind if given: one question to the registry's
        index, however many artifacts lie between (a table version the whole lab trains on)."""
        found = {m.digest: m for m in self.registry.manifests(kind, Where(descends_from=digest)) if m.kind not in REPORTS}
        return sorted(found.values(), key=lambda m: m.created)

    def ancestors(self, digest: str) -> Iterator[Manifest]:
        """Every artifact this one was made from, each once, upstream first (a topological order)."""
        done: set[str] = set()

        def visit(current: str) -> Iterator[Manifest]:
            if current in done or current not in self.manifests:
                return
            done.add(current)
            for parent in sorted(self.manifests[current].inputs.values()):
                yield from visit(parent)
            yield self.manifests[current]

        yield from visit(digest)

    def bases(self, digest: str) -> list[dict[str, Any]]:
        """The models this artifact was made from through `from:`, nearest first, across experiments: each with how the
        experiment that started from it named it (`experiments/base.md#model`, `alias:production`, a digest)."""
        chain: list[dict[str, Any]] = []
        for manifest in reversed(list(self.ancestors(digest))):  # downstream first: the nearest start comes first
            if BASE in manifest.inputs and manifest.inputs[BASE] in self.manifests:
                base = self.manifests[manifest.inputs[BASE]]
                chain.append({**describe(base), "named": manifest.base.get("from", ""), "by": manifest.experiment,
                              "stage": manifest.kind})
        return chain

    def imported(self, digest: str) -> list[dict[str, Any]]:
        """The Hugging Face checkpoints outside the registry that this artifact was made from, with the stages that read
        them: external inputs, known by the digest of their files."""
        found: dict[tuple[str, str], list[str]] = {}
        for manifest in self.ancestors(digest):
            for checkpoint in self.external(manifest):
                found.setdefault((checkpoint["path"], checkpoint["files"]), []).append(f"{manifest.kind} ({manifest.experiment})")
        return [{"path": path, "files": files, "read_by": readers} for (path, files), readers in found.items()]

    def external(self, manifest: Manifest) -> list[dict[str, str]]:
        """The Hugging Face checkpoint a stage read itself (`model.from_hf`): the tokenizer it copied, or the weights the
        first training stage started from."""
        config = manifest.config
        model = config.get("model") if isinstance(config.get("model"), dict) else {}
        if isinstance(config.get("from_hf"), dict):  # the tokenizer of the checkpoint
            source = config["from_hf"]
        elif isinstance(model.get("from_hf"), dict) and (manifest.kind == main_training_kind().name or manifest.summary.get("started_from") == FROM_HF):
            source = model["from_hf"]
        else:
            return []
        return [{"path": str(source.get("path")), "files": str(source.get("files"))}]

    def fine_tuned(self, digest: str) -> list[dict[str, Any]]:
        """Every model made from this one (directly or in rounds), with the data versions its training stages read."""
        below = {m.digest for m in self.descendants(digest)}
        found = []
        for model in self.descendants(digest, model_kind().name):
            trained = [m for m in self.ancestors(model.digest) if m.digest in below and m.kind in stages.TRAINING_STAGES]
            found.append({**describe(model), "data": list(dict.fromkeys(v.ref for m in trained for v in self.read(m))),
                          "stages": [f"{m.kind} ({m.experiment})" for m in trained]})
        return found

    def _tree(self, digest: str, next_of: Any, seen: set[str], *, with_tables: bool) -> dict[str, Any]:
        manifest = self.manifests[digest]
        node = describe(manifest)
        if digest in seen:
            return {**node, "repeated": True}
        seen.add(digest)
        if with_tables:
            node["tables"] = [v.ref for v in self.read(manifest)]
            node["external"] = self.external(manifest)
            node["written"] = [v.ref for v in self.written_by(manifest)]
        node["from" if with_tables else "to"] = [self._tree(d, next_of, seen, with_tables=with_tables) for d in sorted(
            next_of(manifest), key=lambda d: (self.manifests[d].kind, self.manifests[d].created))]
        return node

    def _written(self, manifest: Manifest) -> list[TableVersion]:
        records = self._json(manifest, DATASETS_FILE) or {}
        return [TableVersion(table=r["table"], tag=r["tag"], content_tag=r["content_tag"]) for r in records.values()]

    def _json(self, manifest: Manifest, name: str) -> Any:
        """One JSON file of an artifact, read alone (not the whole artifact, from an object store); None if it has none
        or it cannot be read (lineage shows what it can of a damaged artifact)."""
        try:
            return json.loads(self.registry.read(manifest, name) or b"null")
        except (ArtifactError, OSError, ValueError):
            return None

    def read(self, manifest: Manifest) -> list[TableVersion]:
        """Table versions a stage read straight from the catalog: a blend's parts, a post-training stage's data or tasks."""
        if manifest.kind == provider(BLEND).name:
            parts = (self._json(manifest, BLEND_FILE) or {}).get("parts", [])
            return [TableVersion(table=p["table"], tag=p.get("version") or p["tag"], content_tag=p["tag"]) for p in parts]
        section = manifest.config.get(manifest.kind)
        section = section if isinstance(section, dict) else {}
        data = section.get("data") if isinstance(section.get("data"), dict) else {}
        # The version sft read (its summary names a dataset's version, computed by the data stages), the table `sft.data`
        # pins, or a post-training stage's task set.
        ref = manifest.summary.get("data") or data.get("table") or section.get("tasks")
        if isinstance(ref, str) and "@" in ref:
            table, _, tag = ref.partition("@")
            return [TableVersion(table=table, tag=tag, content_tag=tag)]
        return []


def describe(manifest: Manifest) -> dict[str, Any]:
    """What a person asks of an artifact: kind, digest, experiment, commit, code, when."""
    return {"kind": manifest.kind, "digest": manifest.digest, "experiment": manifest.experiment, "git_commit": manifest.git_commit,
            "code": manifest.code, "created": manifest.created}
