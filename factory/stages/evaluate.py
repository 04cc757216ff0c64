"""`python -m factory.stages.evaluate <request.json>`: evaluate checkpoints on benchmarks, one process for many.

What an evaluation is (its request, items and fingerprints) is in `factory.stages.eval_request`.
A checkpoint is loaded from the bytes whose sha256 its partition recorded, never from whatever
file now sits at its path.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from factory.config.kinds import stage_kind
from factory.config.schema import TrainedModel
from factory.config.stages import StageSpec
from factory.data.blend import Blend
from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.loader import BlendStream
from factory.data.tables import content_of
from factory.errors import ArtifactError, FactoryError
from factory.evals.benchmarks import EvalInputs, benchmark
from factory.evals.scored_on import table_ref
from factory.models.build import new_model
from factory.models.tokenizer import EOS, load_tokenizer
from factory.registry.store import ArtifactStore, Manifest
from factory.runtime.context import BLEND_FILE, TOKENIZER_FILE
from factory.stages.eval_request import KIND, CheckpointRef, EvalRequest, batch_summary, publish_score, scored_on
from factory.runtime.exits import say_error, stop_on_signals
from factory.runtime.report import Reporter, exit_now, open_reporter
from factory.train.checkpoint import load_checkpoint

USAGE = "usage: python -m factory.stages.evaluate <request.json>"


def evaluate(request: EvalRequest, reporter: Reporter) -> dict[str, Manifest]:
    """Evaluate every item not already in the registry; the result manifest of each, by partition."""
    registry = ArtifactStore(request.registry)
    results: dict[str, Manifest] = {}
    pending = []
    for item in request.items:
        manifest = registry.lookup(item.fingerprint(request.code))
        if manifest is None:
            pending.append(item)
        else:
            results[item.partition] = manifest
    reporter.log.info("%d evaluations to compute, %d already in the registry", len(pending), len(results))
    loaded: dict[str, EvalInputs] = {}  # by checkpoint partition: its bytes, and its experiment's settings and data
    unavailable: dict[str, str] = {}
    for item in sorted(pending, key=lambda i: (i.checkpoint.key, i.benchmark)):
        key = item.checkpoint.key
        if key in unavailable:
            continue
        if key not in loaded:
            loaded.clear()  # one model in memory at a time
            try:
                loaded[key] = load_inputs(registry, request.catalog, item.checkpoint)
            except ArtifactError as e:  # the other checkpoints are still evaluated (and kept in the registry)
                unavailable[key] = str(e)
                continue
        inputs = loaded[key]
        bench = benchmark(item.benchmark)
        started = time.perf_counter()
        score = bench.run(inputs)
        seconds = time.perf_counter() - started
        data = scored_on(bench, item.checkpoint, content_of(inputs.catalog, ref) if (ref := table_ref(bench.data)) else "")
        results[item.partition] = publish_score(registry, request, item, bench, score.value, score.count, dict(score.details), seconds, data)
        reporter.log.info("%s: %s = %.4f over %d items (%.1f s)", item.checkpoint.key, bench.name, score.value, score.count, seconds)
    if unavailable:
        count = f"{len(unavailable)} checkpoint" + ("s" if len(unavailable) > 1 else "")
        raise ArtifactError(f"could not evaluate {count} ({len(results)} evaluations done): " + "; ".join(unavailable.values()))
    return results


def load_inputs(registry: ArtifactStore, catalog: CatalogConfig, checkpoint: CheckpointRef) -> EvalInputs:
    """The checkpoint's model, loaded from bytes that match its recorded sha256, with its tokenizer and held-out data."""
    path = locate_checkpoint(registry, checkpoint)
    try:
        state = load_checkpoint(path, checkpoint.sha256)
    except ArtifactError as e:
        raise ArtifactError(f"checkpoint {checkpoint.key} at {path} does not match the sha256 its partition recorded; not evaluated") from e
    spec = StageSpec.from_json(checkpoint.training)
    settings: TrainedModel = stage_kind(spec.kind).read_settings(spec.config)  # the model its checkpoints hold
    tokenizer = load_tokenizer(registry.open(spec.upstream["tokenizer"]) / TOKENIZER_FILE)
    model = new_model(settings.model, tokenizer.get_vocab_size())
    model.load_state_dict(state["model"])
    model.eval()
    blend = Blend.from_json(json.loads((registry.open(spec.upstream["blend"]) / BLEND_FILE).read_text()))

    def validation_texts() -> Iterator[str]:
        stream = BlendStream(catalog=open_catalog(catalog), blend=blend, split="validation", seed=settings.seed,
                             buffer_docs=settings.stream.shuffle_buffer_docs, finite=True)
        return iter(stream.texts())

    return EvalInputs(
        model=model, tokenizer=tokenizer, eos_id=tokenizer.token_to_id(EOS), context=settings.model.context,
        validation_texts=validation_texts, seed=settings.seed, batch_size=checkpoint.eval["batch_size"],
        max_bytes=checkpoint.eval["max_bytes"], catalog=open_catalog(catalog),
    )


def locate_checkpoint(registry: ArtifactStore, checkpoint: CheckpointRef) -> Path:
    """Where the checkpoint is: where its partition recorded it, or in its training artifact if the stage has published since."""
    recorded = Path(checkpoint.path)
    if recorded.exists():
        return recorded
    published = registry.lookup(StageSpec.from_json(checkpoint.training).fingerprint)
    moved = registry.path(published.digest) / recorded.name if published else None
    if moved is not None and moved.exists():
        return moved
    raise ArtifactError(
        f"checkpoint {checkpoint.key} is no longer at {checkpoint.path} nor in its published training artifact: "
        "the retention policy deleted it before it was evaluated; raise pretrain.keep_last to keep more checkpoints"
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit 0 on success, 1 when an evaluation fails, 2 on bad input."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    stop_on_signals()
    try:
        request = EvalRequest.read(Path(args[0]))
        with open_reporter(KIND) as reporter:
            scores, version = batch_summary(evaluate(request, reporter))
            reporter.materialized({"scores": {"raw_value": scores, "type": "json"}, "evaluated": len(scores)}, version)
    except FactoryError as e:
        say_error(str(e))
        return e.exit_code
    except KeyboardInterrupt:
        say_error("interrupted; the evaluations it published are kept, the others run again next time")
        return 1
    return 0


if __name__ == "__main__":
    exit_now(main())
