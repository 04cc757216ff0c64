"""`python -m factory.stages.evaluate <request.json>`: evaluate checkpoints on benchmarks, one process for many.

Each (checkpoint, benchmark) pair is an `evaluations` partition. Its result is an immutable
artifact whose fingerprint covers the benchmark and its version, the checkpoint's sha256, the
tokenizer and held-out data it reads, the settings and the code: a pair already evaluated is
never evaluated again. A checkpoint is loaded from the bytes whose sha256 its partition recorded,
never from whatever file now sits at its path.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from factory.config.fingerprint import sha256_of
from factory.config.schema import ModelConfig
from factory.config.stages import StageSpec
from factory.data.blend import Blend
from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.loader import BlendStream
from factory.errors import ArtifactError, ConfigError, FactoryError
from factory.evals.benchmarks import Benchmark, EvalInputs, benchmark
from factory.models.gpt import GPT
from factory.models.tokenizer import EOS, load_tokenizer
from factory.registry.store import ArtifactStore, Manifest, Provenance
from factory.stages.datasets import BLEND_FILE
from factory.stages.report import Reporter, open_reporter
from factory.stages.runners import TOKENIZER_FILE
from factory.train.checkpoint import load_checkpoint

KIND = "evaluations"
RESULT_FILE = "result.json"
USAGE = "usage: python -m factory.stages.evaluate <request.json>"


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointRef:
    """One `checkpoints` partition as recorded: where its bytes are and what they hash to."""

    key: str
    experiment: str
    step: int
    tokens_seen: int
    path: str
    sha256: str
    training: Mapping[str, Any]
    """The training stage's spec (`config`, `upstream`, `code`) that saved it."""
    eval: Mapping[str, Any]
    """The experiment's `eval` section: max_bytes and batch_size."""
    git_commit: str


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalItem:
    """One `evaluations` partition: a checkpoint on a benchmark."""

    partition: str
    benchmark: str
    checkpoint: CheckpointRef

    def fingerprint(self, code: str) -> str:
        """What decides the score (and, with the partition key, whose score it is: a copied experiment gets its own)."""
        bench, training = benchmark(self.benchmark), self.checkpoint.training
        return sha256_of({
            "kind": KIND, "partition": self.partition, "benchmark": bench.name, "version": bench.version,
            "checkpoint": self.checkpoint.sha256, "model": training["config"]["model"], "seed": training["config"]["seed"],
            "stream": training["config"]["stream"], "upstream": training["upstream"], "max_bytes": self.checkpoint.eval["max_bytes"],
            "code": code,
        })


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalRequest:
    """What the orchestrator hands the evaluation process."""

    items: tuple[EvalItem, ...]
    registry: str
    catalog: CatalogConfig
    code: str
    run_id: str = ""

    def write(self, path: Path) -> Path:
        """Write the request as JSON to `path`."""
        data = {
            "items": [{"partition": i.partition, "benchmark": i.benchmark, "checkpoint": _plain(i.checkpoint)} for i in self.items],
            "registry": self.registry, "catalog": self.catalog.to_json(), "code": self.code, "run_id": self.run_id,
        }
        path.write_text(json.dumps(data, indent=2, sort_keys=True))
        return path

    @classmethod
    def read(cls, path: Path) -> EvalRequest:
        """Read a request written by `write`."""
        try:
            data = json.loads(Path(path).read_text())
            items = tuple(
                EvalItem(partition=i["partition"], benchmark=i["benchmark"], checkpoint=CheckpointRef(**i["checkpoint"])) for i in data["items"]
            )
            return cls(items=items, registry=data["registry"], catalog=CatalogConfig(**data["catalog"]), code=data["code"],
                       run_id=data.get("run_id", ""))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{path}: not an evaluation request ({e})") from e


def _plain(checkpoint: CheckpointRef) -> dict[str, Any]:
    return {name: getattr(checkpoint, name) for name in checkpoint.__slots__}


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
        results[item.partition] = publish_score(registry, request, item, bench, score.value, score.count, dict(score.details), seconds)
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
    config, upstream = checkpoint.training["config"], checkpoint.training["upstream"]
    tokenizer = load_tokenizer(registry.open(upstream["tokenizer"]) / TOKENIZER_FILE)
    model = GPT(ModelConfig.model_validate(config["model"]), tokenizer.get_vocab_size())
    model.load_state_dict(state["model"])
    model.eval()
    blend = Blend.from_json(json.loads((registry.open(upstream["blend"]) / BLEND_FILE).read_text()))

    def validation_texts() -> Iterator[str]:
        stream = BlendStream(catalog=open_catalog(catalog), blend=blend, split="validation", seed=config["seed"],
                             buffer_docs=config["stream"]["shuffle_buffer_docs"], finite=True)
        return iter(stream.texts())

    return EvalInputs(
        model=model, tokenizer=tokenizer, eos_id=tokenizer.token_to_id(EOS), context=model.config.context,
        validation_texts=validation_texts, seed=config["seed"], batch_size=checkpoint.eval["batch_size"],
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


def publish_score(
    registry: ArtifactStore, request: EvalRequest, item: EvalItem, bench: Benchmark, value: float, count: int, details: dict, seconds: float
) -> Manifest:
    """Publish one score as an immutable artifact."""
    checkpoint = item.checkpoint
    summary = {
        "benchmark": bench.name, "version": bench.version, "lower_is_better": bench.lower_is_better, "value": value, "count": count,
        "checkpoint": checkpoint.key, "experiment": checkpoint.experiment, "step": checkpoint.step, "tokens_seen": checkpoint.tokens_seen,
        "checkpoint_sha256": checkpoint.sha256, "training": StageSpec.from_json(checkpoint.training).fingerprint,
    }
    with registry.staging() as out:
        (out / RESULT_FILE).write_text(json.dumps({**summary, "details": details}, indent=2, sort_keys=True, default=str))
        return registry.publish(
            out, kind=KIND, fingerprint=item.fingerprint(request.code),
            config={"benchmark": bench.name, "version": bench.version, "max_bytes": checkpoint.eval["max_bytes"]},
            inputs=dict(checkpoint.training["upstream"]), code=request.code,
            provenance=Provenance(experiment=checkpoint.experiment, config_hash=sha256_of(checkpoint.training["config"])[:16], git_commit=checkpoint.git_commit, run_id=request.run_id),
            summary={**summary, "seconds": round(seconds, 3)},  # the time is the manifest's, not part of the result's bytes
        )


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit 0 on success, 1 when an evaluation fails, 2 on bad input."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        request = EvalRequest.read(Path(args[0]))
        with open_reporter(KIND) as reporter:
            results = evaluate(request, reporter)
            scores = {partition: manifest.summary["value"] for partition, manifest in sorted(results.items())}
            reporter.materialized({"scores": {"raw_value": scores, "type": "json"}, "evaluated": len(scores)}, sha256_of(
                {partition: manifest.digest for partition, manifest in sorted(results.items())}))
    except FactoryError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
