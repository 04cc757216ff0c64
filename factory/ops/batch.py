"""`factory data batch EXPERIMENT STEP`: the exact training batch a step saw, fetched again from the blend.

The trainer records the loader's position every `log_every` steps; the batch is replayed from
the nearest recorded position at or before the step, so nothing is stored per batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import islice
from typing import Any

from pyiceberg.catalog import Catalog

from factory.config import Experiment, plan_stage, upstream_of
from factory.config.kinds import BLEND, TOKENIZER, main_training_kind, provider
from factory.config.schema import StreamSettings
from factory.config.stages import stages_of
from factory.data.blend import Blend
from factory.data.loader import PAD, LoaderState, build_loader
from factory.data.tables import read_version, resolve
from factory.errors import ArtifactError, ConfigError
from factory.models.tokenizer import end_of_text, fetched_tokenizer, load_tokenizer
from factory.registry.layout import BLEND_FILE, POSITIONS_FILE
from factory.registry.seam import Registry
from factory.registry.store import Manifest, read_required


@dataclass(frozen=True, kw_only=True, slots=True)
class FetchedSequence:
    """One sequence of a fetched batch: its tokens and where its documents came from."""

    tokens: list[int]
    real_tokens: int
    documents: list[dict[str, str]]


def stage_manifests(experiment: Experiment, registry: Registry, until: str) -> dict[str, Manifest]:
    """The manifests of the experiment's published artifacts up to stage `until`; an error names the first one missing."""
    found: dict[str, Manifest] = {}
    for kind in stages_of(experiment):
        manifest = registry.lookup(plan_stage(experiment, kind, {n: found[n].digest for n in upstream_of(experiment, kind)}).fingerprint)
        if manifest is None:
            raise ArtifactError(f"{experiment.name} has no published {kind} artifact: run `factory run {experiment.source or experiment.name}` first")
        found[kind] = manifest
        if kind == until:
            return found
    raise ConfigError(f"{experiment.name} has no {until} stage: its file has no section for it")


def fetch_batch(experiment: Experiment, step: int, registry: Registry, catalog: Catalog) -> list[FetchedSequence]:
    """The batch that training step `step` (0-based) consumed: from the training's data positions and the blend (each
    file read alone, not the training artifact with its checkpoints) and the tokenizer."""
    if experiment.pretrain is None:
        raise ConfigError(f"{experiment.name} has no pretrain section, so no training batches")
    if not 0 <= step < experiment.pretrain.steps:
        raise ConfigError(f"step {step} is outside the run: {experiment.name} trains steps 0..{experiment.pretrain.steps - 1}")
    training = main_training_kind().name
    manifests = stage_manifests(experiment, registry, training)
    positions = [json.loads(line) for line in read_required(registry, manifests[training], POSITIONS_FILE).decode().splitlines() if line]
    start = max((p for p in positions if p["step"] <= step), key=lambda p: p["step"])
    blend = Blend.from_json(json.loads(read_required(registry, manifests[provider(BLEND).name], BLEND_FILE)))
    tokenizer_file = fetched_tokenizer(registry, manifests[provider(TOKENIZER).name])
    tokenizer = load_tokenizer(tokenizer_file)
    loader = build_loader(
        catalog, blend, tokenizer, end_of_text(tokenizer, tokenizer_file), experiment.model.context, experiment.seed, StreamSettings.of(experiment.data)
    )
    size = experiment.pretrain.batch_size  # a batch is the next `size` sequences: skip whole batches to the step
    sequences = loader.sequences(LoaderState.from_json(start["state"]))
    batch = list(islice(sequences, (step - start["step"]) * size, (step - start["step"] + 1) * size))
    if len(batch) < size:
        raise ArtifactError(f"the blend of {experiment.name} ran out before step {step}")
    paths = document_paths(catalog, blend)
    return [
        FetchedSequence(
            tokens=[t for t in s.tokens.tolist() if t != PAD],
            real_tokens=int((s.tokens != PAD).sum()),
            documents=[{"id": doc, **paths.get(doc, {})} for doc in s.documents],
        )
        for s in batch
    ]


def document_paths(catalog: Catalog, blend: Blend) -> dict[str, dict[str, str]]:
    """Document id -> the table and path it came from, over every part of the blend."""
    found: dict[str, dict[str, str]] = {}
    for part in blend.parts:
        rows = read_version(catalog, part.table, resolve(catalog, part.table, part.tag), ("id", "path"))
        for doc, path in zip(rows["id"].to_pylist(), rows["path"].to_pylist(), strict=True):
            found[doc] = {"table": f"{part.table}@{part.version}", "path": path}
    return found


def to_json(sequences: list[FetchedSequence]) -> list[dict[str, Any]]:
    """Plain JSON form."""
    return [{"tokens": s.tokens, "real_tokens": s.real_tokens, "documents": s.documents} for s in sequences]
