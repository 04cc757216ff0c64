"""The `evaluation` stage kind: checkpoints scored on benchmarks, a batch of (checkpoint, benchmark) pairs per stage.

Each pair is an `evaluations` partition. Its score is an immutable artifact of its own (registry kind `evaluations`)
whose fingerprint covers the benchmark and its version, the checkpoint's sha256, the model, seed and stream of the
training stage that saved it, the held-out data it reads and the code: a pair already scored is never scored again,
whichever batch it comes in. The batch itself is a stage like any other: its settings are its pairs, it runs
through the launcher (a process here, a Volcano Job on a cluster), and it publishes a small artifact listing the
score of each pair, so the same batch asked again is a cache hit.

The kind is not part of any experiment's chain (`scope="checkpoints"`): the `evaluations` asset builds a batch
from the partitions of its run. This module stays light; the scoring, which loads models, is
`factory.stages.scoring`, imported when a batch runs.
"""

from __future__ import annotations

import json
import marshal
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from factory.config.fingerprint import canonical_parts, sha256_of, sha256_of_parts
from factory.config.kinds import StageKind, stage_kind
from factory.config.schema import TrainedModel
from factory.config.section import Section
from factory.config.stages import StageSpec
from factory.evals.base import EVALUATIONS
from factory.evals.benchmarks import benchmark
from factory.registry.layout import BATCH_FILE
from factory.registry.store import Manifest, Provenance

if TYPE_CHECKING:
    from factory.runtime.context import StageContext


class CheckpointEval(Section):
    """How the experiment that saved a checkpoint has it evaluated (its `eval` section, as the partition recorded it)."""

    max_bytes: int
    batch_size: int
    primary: str | None = None
    """The benchmark that ranks the experiment's models (`eval.primary`; unset: the board's default)."""


class CheckpointRef(Section):
    """One `checkpoints` partition as recorded: where its bytes are and what they hash to."""

    key: str
    experiment: str
    step: int
    tokens_seen: int
    path: str
    sha256: str
    training: dict[str, Any]
    """The spec (`kind`, `config`, `upstream`, `code`) of the training stage that saved it."""
    eval: CheckpointEval
    git_commit: str

    @property
    def spec(self) -> StageSpec:
        """The spec of the training stage that saved it."""
        return StageSpec.from_json(self.training)

    def settings(self, spec: StageSpec | None = None) -> TrainedModel:
        """The training stage's settings, typed: the model its checkpoints hold, its seed and its stream (of `spec`, its
        spec when read already)."""
        spec = self.spec if spec is None else spec
        return stage_kind(spec.kind).read_settings(spec.config)


class EvalItem(Section):
    """One `evaluations` partition: a checkpoint on a benchmark."""

    partition: str
    benchmark: str
    checkpoint: CheckpointRef

    def fingerprint(self, code: str) -> str:
        """What decides the score (and, with the partition key, whose score it is: a copied experiment gets its own)."""
        bench, checkpoint = benchmark(self.benchmark), self.checkpoint
        return sha256_of_parts({**canonical_parts({
            "kind": EVALUATIONS, "partition": self.partition, "benchmark": bench.name, "version": bench.version,
            "checkpoint": checkpoint.sha256, "max_bytes": checkpoint.eval.max_bytes, "code": code,
            **({"benchmark_code": bench.code} if bench.code else {}),
            **({"benchmark_settings": dict(bench.settings)} if bench.settings else {}),
        }), **_trained(checkpoint)})


TRAINED_KEPT = 8
"""Training specs whose part of an evaluation's fingerprint `_trained` keeps (the oldest goes first)."""
_trained_kept: dict[bytes | str, dict[str, str]] = {}
_trained_lock = threading.Lock()


def _trained(checkpoint: CheckpointRef) -> dict[str, str]:
    """What the spec of the training stage that saved `checkpoint` puts in the fingerprint of its evaluations: the model,
    seed and stream it trained and its inputs, as canonical JSON (`canonical_parts`). Read and serialized once for the
    checkpoints of one training, as a backfill's planning asks of thousands; not to be changed by the caller."""
    key = _spec_key(checkpoint.training)
    with _trained_lock:
        fields = _trained_kept.get(key)
    if fields is not None:
        return fields
    spec = checkpoint.spec
    trained = checkpoint.settings(spec)
    fields = canonical_parts({"model": trained.model.model_dump(mode="json"), "seed": trained.seed,
                              "stream": trained.stream.model_dump(mode="json"), "upstream": dict(spec.upstream)})
    with _trained_lock:
        while len(_trained_kept) >= TRAINED_KEPT:
            del _trained_kept[next(iter(_trained_kept))]
        _trained_kept[key] = fields
    return fields


def _spec_key(training: Mapping[str, Any]) -> bytes | str:
    """What tells one training spec from another exactly: its `marshal` bytes (a fifth of the time its `repr` takes), or
    its `repr` should it hold what marshal refuses. For JSON data both are equal only for equal JSON, the types and signs
    of numbers included, where `==` is not: `1`, `1.0` and `True` are equal in Python, and so are `0.0` and `-0.0`, but
    not their JSON, nor so the fingerprints."""
    try:
        return marshal.dumps(training)
    except ValueError:
        return repr(training)


class EvaluationSettings(Section):
    """A batch: the pairs it scores. The fingerprint of the batch hashes them; each pair's own fingerprint decides
    whether it is scored."""

    items: tuple[EvalItem, ...]


def batch_spec(items: tuple[EvalItem, ...], code: str) -> StageSpec:
    """The stage that scores `items` with the evaluation code `code`."""
    return StageSpec(kind=EVALUATION.name, config=EvaluationSettings(items=items).model_dump(mode="json"), upstream={}, code=code)


def batch_provenance(items: tuple[EvalItem, ...], config: Mapping[str, Any], run_id: str) -> Provenance:
    """Who asks for a batch: the experiments of its checkpoints (and their commit, when they share one)."""
    commits = {item.checkpoint.git_commit for item in items}
    return Provenance(experiment=", ".join(sorted({item.checkpoint.experiment for item in items})), config_hash=sha256_of(config)[:16],
                      git_commit=commits.pop() if len(commits) == 1 else "", run_id=run_id)


def batch_summary(results: Mapping[str, Manifest]) -> tuple[dict[str, float], str]:
    """A batch as its materialization shows it: the score of each partition, and the batch's data version (the digests
    of its results)."""
    scores = {partition: manifest.summary["value"] for partition, manifest in sorted(results.items())}
    return scores, sha256_of({partition: manifest.digest for partition, manifest in sorted(results.items())})


def run(ctx: StageContext) -> dict[str, Any]:
    """Score every pair of the batch not already in the registry; the batch's artifact lists each pair's score."""
    from factory.stages.scoring import evaluate  # loads models: only where a batch runs

    settings: EvaluationSettings = ctx.settings
    results = evaluate(settings.items, ctx.registry, ctx.request.catalog, ctx.request.spec.code, ctx.request.provenance.run_id, ctx.log)
    scores, version = batch_summary(results)
    listing = {partition: {"value": manifest.summary["value"], "result": manifest.digest} for partition, manifest in sorted(results.items())}
    (ctx.out / BATCH_FILE).write_text(json.dumps(listing, indent=2, sort_keys=True))
    return {"scores": scores, "evaluated": len(scores), "results_version": version}


EVALUATION = StageKind(
    name="evaluation", run=run, scope="checkpoints", settings=EvaluationSettings, artifact=frozenset({"torch"}),
    imports=("factory.stages.scoring", "factory.evals.suite", "factory.evals.bpb", "factory.evals.next_line", "factory.evals.code_exec",
             "factory.evals.sanity"),  # the scoring and the benchmarks it loads on first use
    description="Checkpoints scored on benchmarks, a batch of `evaluations` partitions per stage; each score is an immutable "
                "artifact, never computed twice.",
)
