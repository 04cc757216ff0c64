"""Scoring a batch of (checkpoint, benchmark) pairs: what an `evaluation` stage runs (`factory.stages.evaluation`).

A checkpoint is loaded from the bytes whose sha256 its partition recorded, never from whatever file now sits at its
path, and one model is in memory at a time.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from factory.config.fingerprint import sha256_of
from factory.config.kinds import BLEND, TOKENIZER, provider, stage_kinds
from factory.config.sft_data import SFTData
from factory.config.stages import BASE
from factory.data.blend import Blend
from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.loader import BlendStream
from factory.data.tables import content_of
from factory.devices import device_for
from factory.errors import ArtifactError
from factory.evals.base import EVALUATIONS
from factory.evals.benchmarks import Benchmark, EvalInputs, benchmark
from factory.evals.scored_on import own_split, pinned, table_ref
from factory.models.build import new_model
from factory.models.tokenizer import end_of_text, fetched_tokenizer, load_tokenizer
from factory.registry.layout import BLEND_FILE, CHAT_TEMPLATE_FILE, RESULT_FILE
from factory.registry.seam import Registry
from factory.registry.store import Manifest, Provenance, manifest_of, read_required
from factory.train.checkpoint import load_checkpoint
from factory.train.heap import keep_freed_memory

if TYPE_CHECKING:  # the kind's module imports this one when a batch runs
    from factory.stages.evaluation import CheckpointRef, EvalItem


def evaluate(
    items: Iterable[EvalItem], registry: Registry, catalog: CatalogConfig, code: str, run_id: str, log: logging.Logger
) -> dict[str, Manifest]:
    """Score every item not already in the registry with the evaluation code `code`; the result manifest of each, by
    partition. A checkpoint that cannot be loaded is named in an ArtifactError once the others are scored and kept."""
    results: dict[str, Manifest] = {}
    pending = []
    for item in items:
        manifest = registry.lookup(item.fingerprint(code))
        if manifest is None:
            pending.append(item)
        else:
            results[item.partition] = manifest
    log.info("%d evaluations to compute, %d already in the registry", len(pending), len(results))
    if pending:
        keep_freed_memory()  # every batch of a benchmark frees the logits the next one allocates again
    loaded: dict[str, EvalInputs] = {}  # by checkpoint partition: its bytes, and its experiment's settings and data
    unavailable: dict[str, str] = {}
    for item in sorted(pending, key=lambda i: (i.checkpoint.key, i.benchmark)):
        key = item.checkpoint.key
        if key in unavailable:
            continue
        if key not in loaded:
            loaded.clear()  # one model in memory at a time
            try:
                loaded[key] = load_inputs(registry, catalog, item.checkpoint)
            except ArtifactError as e:  # the other checkpoints are still evaluated (and kept in the registry)
                unavailable[key] = str(e)
                continue
        inputs = loaded[key]
        bench = benchmark(item.benchmark)
        started = time.perf_counter()
        score = bench.run(inputs)
        seconds = time.perf_counter() - started
        data = scored_on(bench, item.checkpoint, content_of(inputs.catalog, ref) if (ref := table_ref(bench.data)) else "")
        results[item.partition] = publish_score(registry, item, bench, score.value, score.count, dict(score.details), seconds, data,
                                                code, run_id)
        log.info("%s: %s = %.4f over %d items (%.1f s)", key, bench.name, score.value, score.count, seconds)
    if unavailable:
        count = f"{len(unavailable)} checkpoint" + ("s" if len(unavailable) > 1 else "")
        raise ArtifactError(f"could not evaluate {count} ({len(results)} evaluations done): " + "; ".join(unavailable.values()))
    return results


def scored_on(bench: Benchmark, checkpoint: CheckpointRef, content: str = "") -> str:
    """The identity of the data `bench` scores `checkpoint` on (`factory.evals.scored_on`): the experiment's own held-out split
    as its evaluations read it, or the benchmark's shared data (with `content`, what its pinned table version holds)."""
    if bench.data:
        return pinned(bench.data, content) if content else bench.data
    trained = checkpoint.settings()
    return own_split(checkpoint.spec.upstream[provider(BLEND).name], trained.seed, trained.stream.shuffle_buffer_docs, checkpoint.eval.max_bytes)


def publish_score(
    registry: Registry, item: EvalItem, bench: Benchmark, value: float, count: int, details: dict, seconds: float, data: str,
    code: str, run_id: str = "",
) -> Manifest:
    """Publish one score as an immutable artifact (registry kind `evaluations`); `data` is the identity of the data it was
    scored on (`scored_on`)."""
    checkpoint = item.checkpoint
    summary = {
        "benchmark": bench.name, "version": bench.version, "lower_is_better": bench.lower_is_better, "value": value, "count": count,
        "data": data,
        "checkpoint": checkpoint.key, "experiment": checkpoint.experiment, "step": checkpoint.step, "tokens_seen": checkpoint.tokens_seen,
        "checkpoint_sha256": checkpoint.sha256, "training": checkpoint.spec.fingerprint,
    }
    with registry.staging() as out:
        (out / RESULT_FILE).write_text(json.dumps({**summary, "details": details}, indent=2, sort_keys=True, default=str))
        return registry.publish(
            out, kind=EVALUATIONS, fingerprint=item.fingerprint(code),
            config={"benchmark": bench.name, "version": bench.version, "max_bytes": checkpoint.eval.max_bytes},
            inputs=dict(checkpoint.spec.upstream), code=code,
            provenance=Provenance(experiment=checkpoint.experiment, config_hash=sha256_of(checkpoint.spec.config)[:16],
                                  git_commit=checkpoint.git_commit, run_id=run_id),
            summary={**summary, "seconds": round(seconds, 3),  # the time and the ranking are the manifest's, not the result's bytes
                     **({"primary": checkpoint.eval.primary} if checkpoint.eval.primary else {})},
        )


def load_inputs(registry: Registry, catalog: CatalogConfig, checkpoint: CheckpointRef) -> EvalInputs:
    """The checkpoint's model, loaded from bytes that match its recorded sha256, with its tokenizer and held-out data."""
    path = locate_checkpoint(registry, checkpoint)
    try:
        state = load_checkpoint(path, checkpoint.sha256)
    except ArtifactError as e:
        raise ArtifactError(f"checkpoint {checkpoint.key} at {path} does not match the sha256 its partition recorded; not evaluated") from e
    spec = checkpoint.spec
    settings = checkpoint.settings(spec)  # the model its checkpoints hold
    tokenizer_file = fetched_tokenizer(registry, manifest_of(registry, spec.upstream[provider(TOKENIZER).name]))
    tokenizer = load_tokenizer(tokenizer_file)
    model = new_model(settings.model, tokenizer.get_vocab_size())
    model.load_state_dict(state["model"])
    model.to(device_for(None)).eval()  # an evaluation batch computes on its machine's (its pod's) GPU when it has one
    blend = Blend.from_json(json.loads(read_required(registry, manifest_of(registry, spec.upstream[provider(BLEND).name]), BLEND_FILE)))

    def validation_texts() -> Iterator[str]:
        stream = BlendStream(catalog=open_catalog(catalog), blend=blend, split="validation", seed=settings.seed,
                             buffer_docs=settings.stream.shuffle_buffer_docs, finite=True)
        return iter(stream.texts())

    return EvalInputs(
        model=model, tokenizer=tokenizer, eos_id=end_of_text(tokenizer, tokenizer_file), context=settings.model.context,
        validation_texts=validation_texts, seed=settings.seed, batch_size=checkpoint.eval.batch_size,
        max_bytes=checkpoint.eval.max_bytes, catalog=open_catalog(catalog), chat_template=trained_chat_template(registry, checkpoint),
    )


def trained_chat_template(registry: Registry, checkpoint: CheckpointRef) -> str | None:
    """The chat template the checkpoint's model was taught with, as its training stage chose it (`starting_template`):
    the file's `sft.data.chat_template`, else the template of the model the stage started from (the imported checkpoint's,
    or the `chat_template.jinja` its input keeps), else, for fine-tuning on rows, the format's default. None without one."""
    from factory.config.hf_checkpoint import read_checkpoint

    spec = checkpoint.spec
    settings = checkpoint.settings(spec)
    data = getattr(getattr(settings, spec.kind, None), "data", None)
    data = data if isinstance(data, SFTData) else None  # sft's rows and their template (a plugin's `data` is its own)
    if data is not None and data.chat_template is not None:
        return data.chat_template
    trained = [kind.name for kind in stage_kinds() if kind.checkpoints and kind.name in spec.upstream and kind.name != spec.kind]
    start = next((name for name in (BASE, *reversed(trained)) if name in spec.upstream), None)
    if start is not None:
        kept = registry.read(manifest_of(registry, spec.upstream[start]), CHAT_TEMPLATE_FILE)  # that file, not the checkpoints
        if kept is not None:
            return kept.decode()
    elif (source := settings.model.from_hf) is not None:
        imported = read_checkpoint(source.path)
        if imported.chat_template is not None and imported.chat_template_problem() is None:
            return imported.chat_template
    return data.template if data is not None else None


def locate_checkpoint(registry: Registry, checkpoint: CheckpointRef) -> Path:
    """Where the checkpoint is: where its partition recorded it, or in its training artifact if the stage has published since."""
    recorded = Path(checkpoint.path)
    if "://" not in checkpoint.path and recorded.exists():  # a path on this disk, not a published one's place in a store
        return recorded
    published = registry.lookup(checkpoint.spec.fingerprint)
    moved = registry.fetch(published, recorded.name) if published else None  # that checkpoint alone, from a store
    if moved is not None and moved.exists():
        return moved
    raise ArtifactError(
        f"checkpoint {checkpoint.key} is no longer at {checkpoint.path} nor in its published training artifact: "
        "the retention policy deleted it before it was evaluated; raise pretrain.keep_last to keep more checkpoints"
    )
