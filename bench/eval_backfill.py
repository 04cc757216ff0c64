"""Orchestration cost per `evaluations` partition: one run per partition vs. the backfill policy's batches.

Real checkpoints (tiny GPTs, distinct seeds) are recorded as `checkpoints` partitions of a real
Dagster instance, then evaluated on a benchmark that costs next to nothing, through the same
code path as `factory evals backfill`: in-process Dagster runs, each launching one evaluation
process. What is left is what orchestration costs per partition: run launch, process start,
checkpoint load and checksum, result publish. Both modes run here, one after the other. `--smoke`: a few partitions
each, to check the bench runs.
"""

import argparse
import hashlib
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from dagster import AssetMaterialization, DagsterInstance, MetadataValue, materialize

REPO = Path(__file__).resolve().parents[1]
os.environ["FACTORY_BENCHMARKS"] = "bench.weight_benchmark"  # read by the evaluation processes too
sys.path.insert(0, str(REPO))

from assets.backfill import evaluate_checkpoints  # noqa: E402
from assets.evaluations import EVALS_PER_RUN  # noqa: E402
from assets.execution import EVERYTHING, failure_messages, resources_at  # noqa: E402
from assets.partitions import CHECKPOINTS  # noqa: E402
from factory.cli.common import dagster_home  # noqa: E402
from factory.config.kinds import stage_kind  # noqa: E402
from factory.config.schema import Experiment, ModelConfig, TokenizerConfig  # noqa: E402
from factory.models.build import build_model  # noqa: E402
from factory.models.tokenizer import train_tokenizer  # noqa: E402
from factory.registry import ArtifactStore, Provenance  # noqa: E402

UNBATCHED = 8
BATCHED = 200
SMOKE = (1, 2)
"""(unbatched, batched) partitions of `--smoke`."""
MODEL = ModelConfig(n_layer=1, n_head=2, n_embd=32, context=64)
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def publish(registry: ArtifactStore, kind: str, name: str, data: bytes) -> str:
    with registry.staging() as out:
        (out / name).write_bytes(data)
        manifest = registry.publish(out, kind=kind, fingerprint=f"bench-{kind}", config={}, inputs={}, code="bench",
                                    provenance=Provenance(experiment="bench", config_hash="bench", git_commit="bench"), summary={})
    return manifest.digest


def record_checkpoints(root: Path, instance: DagsterInstance, count: int) -> list[str]:
    """`count` distinct checkpoints on disk, recorded as partitions the way a training stage records them."""
    registry = ArtifactStore(root / "registry")
    texts = [Path(module.__file__).read_text() for module in (os, tempfile, warnings)]
    tokenizer = train_tokenizer(texts, TokenizerConfig(vocab_size=300, sample_bytes=100_000))
    upstream = {"tokenizer": publish(registry, "tokenizer", "tokenizer.json", tokenizer.to_str().encode()),
                "blend": publish(registry, "blend", "blend.json", b'{"parts": [], "validation_percent": 5}')}
    experiment = Experiment.model_validate({"name": "bench", "model": MODEL.model_dump(mode="json"), "pretrain": {"steps": 1}})
    settings = stage_kind("pretrain").fingerprint(experiment).model_dump(mode="json")  # what a pretrain stage records
    training = {"kind": "pretrain", "config": settings, "upstream": upstream, "code": "bench"}
    keys = [f"bench__pretrain-{step:06d}" for step in range(1, count + 1)]
    instance.add_dynamic_partitions(CHECKPOINTS, keys)
    (root / "checkpoints").mkdir()
    for step, key in enumerate(keys, start=1):
        path = root / "checkpoints" / f"step_{step:06d}.pt"
        torch.save({"model": build_model(MODEL, tokenizer.get_vocab_size(), seed=step).state_dict()}, path)
        metadata = {"step": step, "tokens_seen": step, "path": MetadataValue.path(str(path)), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                    "training": MetadataValue.json(training), "eval": MetadataValue.json({"max_bytes": 1000, "batch_size": 8}),
                    "git_commit": "bench", "experiment": "bench"}
        instance.report_runless_asset_event(AssetMaterialization(CHECKPOINTS, partition=key, metadata=metadata))
    return keys


def timed(root: Path, instance: DagsterInstance, keys: list[str], limit: int) -> tuple[float, int]:
    def run(**options):
        return materialize(EVERYTHING, instance=instance, resources=resources_at(root), raise_on_error=False, run_config=QUIET, **options)

    started = time.perf_counter()
    results = evaluate_checkpoints(instance, ["mean_abs_weight"], set(keys), run, limit=limit)
    seconds = time.perf_counter() - started
    if not all(result.success for result in results):
        sys.exit("\n".join(message for result in results for message in failure_messages(result)))
    return seconds, len(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE[0]} and {SMOKE[1]} partitions: checks the bench runs")
    unbatched, batched = SMOKE if parser.parse_args().smoke else (UNBATCHED, BATCHED)
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["DAGSTER_HOME"] = str(dagster_home(root))
        instance = DagsterInstance.get()
        keys = record_checkpoints(root, instance, unbatched + batched)
        one, one_runs = timed(root, instance, keys[:unbatched], limit=1)
        many, many_runs = timed(root, instance, keys[unbatched:], limit=EVALS_PER_RUN)
    per_one, per_many = one / unbatched, many / batched
    print(f"one run per partition: {unbatched} partitions in {one_runs} runs, {one:.1f} s: {per_one:.2f} s per partition")
    print(f"backfill policy ({EVALS_PER_RUN} per run): {batched} partitions in {many_runs} runs, {many:.1f} s: {per_many:.3f} s per partition")
    print(f"ratio per-partition cost, one run each / batched: {per_one / per_many:.1f}x")


if __name__ == "__main__":
    main()
