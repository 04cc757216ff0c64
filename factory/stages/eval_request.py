"""What an evaluation is, without running one: the request, its items and their fingerprints, and a score published.

Each (checkpoint, benchmark) pair is an `evaluations` partition. Its result is an immutable
artifact whose fingerprint covers the benchmark and its version, the checkpoint's sha256, the
tokenizer and held-out data it reads, the settings and the code: a pair already evaluated is
never evaluated again. The orchestrator reads this to find results already in the registry
without starting the evaluation process (`factory.stages.evaluate`), which loads the models.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from factory.config.fingerprint import sha256_of
from factory.config.kinds import stage_kind
from factory.config.stages import StageSpec
from factory.data.catalog import CatalogConfig
from factory.errors import ConfigError
from factory.evals.benchmarks import Benchmark, benchmark
from factory.evals.scored_on import own_split, pinned
from factory.registry.store import ArtifactStore, Manifest, Provenance

KIND = "evaluations"
RESULT_FILE = "result.json"


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


def scored_on(bench: Benchmark, checkpoint: CheckpointRef, content: str = "") -> str:
    """The identity of the data `bench` scores `checkpoint` on (`factory.evals.scored_on`): the experiment's own held-out split
    as its evaluations read it, or the benchmark's shared data (with `content`, what its pinned table version holds)."""
    if bench.data:
        return pinned(bench.data, content) if content else bench.data
    settings = stage_kind(checkpoint.training["kind"]).read_settings(checkpoint.training["config"])
    return own_split(checkpoint.training["upstream"]["blend"], settings.seed, settings.stream.shuffle_buffer_docs,
                     checkpoint.eval["max_bytes"])


def publish_score(
    registry: ArtifactStore, request: EvalRequest, item: EvalItem, bench: Benchmark, value: float, count: int, details: dict, seconds: float,
    data: str,
) -> Manifest:
    """Publish one score as an immutable artifact; `data` is the identity of the data it was scored on (`scored_on`)."""
    checkpoint = item.checkpoint
    summary = {
        "benchmark": bench.name, "version": bench.version, "lower_is_better": bench.lower_is_better, "value": value, "count": count,
        "data": data,
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


def batch_summary(results: Mapping[str, Manifest]) -> tuple[dict[str, float], str]:
    """A batch of evaluations as its materialization shows it: the score of each partition, and the batch's data version
    (the digests of its results)."""
    scores = {partition: manifest.summary["value"] for partition, manifest in sorted(results.items())}
    return scores, sha256_of({partition: manifest.digest for partition, manifest in sorted(results.items())})
