"""bench/scale.py's histories: the root a history of N manifests is, made once without training anything and reused.

A history (`history`, made by `make_history`) is a registry of N manifests in experiments of a lab's mix of kinds
(`BLOCK`: two in three are evaluation results), each naming its inputs, without artifact bytes (listings and lineage read
manifests only), beside the tiny recipe's stages all published; a git repository of N/100 experiment files that came in
N/400 commits; and a Dagster instance on PostgreSQL recording the registry's first N/10 checkpoints x
`BENCHMARK_PARTITIONS` benchmarks, with the materializations of those checkpoints and of their evaluation results in the
registry, and a run of a backfill's shape. Its record (`MADE`) is written last.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


BLOCK = (("tokenizer", {}), ("pretrain", {"tokenizer": 0}), ("sft", {"pretrain": 1}), ("rl", {"sft": 2}),
         ("model", {"pretrain": 1}), ("model", {"rl": 3}), *(("evaluations", {"training": 1 + i % 3}) for i in range(12)))
"""One experiment's artifacts, 18 manifests: its tokenizer, pretrain, SFT and RL runs, two models, twelve evaluation
results (two in three manifests: four checkpoints of each training run); each names its inputs by their place."""
BENCHMARKS = ("val_bpb", "heldout_bpb")
STEPS = (25, 50, 75, 100)
"""The steps of a training run's checkpoints that are evaluated (each on one of BENCHMARKS)."""
SHARED_BLEND = "b" * 64
"""The data every experiment's tokenizer was made from (one blend, as a lab's main corpus): what `factory lineage
TABLE@tag` walks down from to the models trained on it."""


def summary(kind: str, block: int, place: int, fingerprints: list[str]) -> dict:
    """What the stage would have recorded: a training run's steps, an evaluation's result as the evaluator writes it."""
    if kind in ("pretrain", "sft", "rl"):
        return {"steps": 100}
    if kind != "evaluations":
        return {}
    training = BLOCK[place][1]["training"]
    stage, step = BLOCK[training][0], STEPS[(place - 6) // 3 % 4]
    return {"benchmark": BENCHMARKS[place % 2], "version": 1, "lower_is_better": True, "value": 1.0 + (block * 7 + place) % 13 / 10,
            "count": 64, "data": "", "checkpoint": f"exp-{block}__{stage}-{step:06d}", "experiment": f"exp-{block}", "step": step,
            "tokens_seen": 1000 * step, "training": fingerprints[training], "seconds": 0.5}


def fill(root: Path, count: int) -> None:
    """`count` manifests under `root/manifests` (whole blocks), written as the registry writes them."""
    from factory.registry.store import ArtifactStore, Manifest, Provenance

    store = ArtifactStore(root)
    for shard in range(256):
        (root / "manifests" / f"{shard:02x}").mkdir(parents=True)
    blend = Manifest.new(kind="blend", fingerprint="blend-shared", digest=SHARED_BLEND, files={"blend.json": {"sha256": SHARED_BLEND, "bytes": 100}},
                         config={}, inputs={}, code="local:0123456789abcdef", summary={},
                         provenance=Provenance(experiment="exp-0", config_hash="0" * 16, git_commit="f" * 40))
    store.manifest_path("blend-shared").write_text(json.dumps(blend.to_json(), indent=2, sort_keys=True))
    for block in range(max(count // len(BLOCK), 1)):
        digests = [f"{block * len(BLOCK) + i:064x}" for i in range(len(BLOCK))]
        fingerprints = [f"{kind}-{digest[-12:]}" for (kind, _), digest in zip(BLOCK, digests, strict=True)]
        for i, (kind, inputs) in enumerate(BLOCK):
            manifest = Manifest.new(kind=kind, fingerprint=fingerprints[i], digest=digests[i],
                                    files={"result.json" if kind == "evaluations" else "model.pt": {"sha256": digests[i], "bytes": 100}},
                                    config={"lr": 0.001 * (block % 7), "steps": 100},
                                    inputs={name: digests[at] for name, at in inputs.items()} | ({"blend": SHARED_BLEND} if kind == "tokenizer" else {}),
                                    code="local:0123456789abcdef",
                                    provenance=Provenance(experiment=f"exp-{block}", config_hash="0" * 16, git_commit="f" * 40),
                                    summary=summary(kind, block, i, fingerprints))
            store.manifest_path(manifest.fingerprint).write_text(json.dumps(manifest.to_json(), indent=2, sort_keys=True))


def publish_tiny(store) -> object:
    """The tiny recipe's stages published as `factory plan` plans them at this code (a file each, no work), those not
    published yet: an experiment all cached."""
    from factory.config import load, plan_stage
    from factory.config.stages import stages_of
    from factory.registry.store import Provenance

    tiny = load(ROOT / "experiments" / "tiny-code-lm.md")
    digests: dict[str, str] = {}
    for kind in stages_of(tiny):
        spec = plan_stage(tiny, kind, digests)
        if (published := store.lookup(spec.fingerprint)) is not None:
            digests[kind] = published.digest
            continue
        with store.staging() as out:
            (out / "x").write_text(spec.fingerprint)
            digests[kind] = store.publish(out, kind=kind, fingerprint=spec.fingerprint, config=spec.config, inputs=spec.upstream,
                                          code=spec.code, summary={},
                                          provenance=Provenance(experiment=tiny.name, config_hash="0" * 16, git_commit="f" * 40)).digest
    return tiny


def publish_model_files(store) -> str:
    """An exported model with its files (config and weights, not loadable): the sha256 of its weights."""
    from factory.registry.store import Provenance

    with store.staging() as out:
        (out / "config.json").write_text(json.dumps({"model": {"n_layer": 1}, "steps": 1}))
        (out / "model.pt").write_bytes(b"weights")
        manifest = store.publish(out, kind="model", fingerprint="model-with-files", config={}, inputs={}, code="local:0", summary={},
                                 provenance=Provenance(experiment="exp-files", config_hash="0" * 16, git_commit="f" * 40))
    return manifest.files["model.pt"]["sha256"]


FORMAT = 3
"""What `make_history` writes (raised when that changes): a history of another format is made again."""
MADE = "made.json"
"""A history's record, written last: a root without it (a make that did not finish) is made again."""


def shape(count: int) -> dict[str, int]:
    """A history of `count` manifests in a lab's proportions: its experiment files, the commits they came in and its
    checkpoints (1,000 files in 250 commits and 10,000 checkpoints at 100,000 manifests)."""
    files = max(5, count // 100)
    return {"format": FORMAT, "manifests": count, "files": files, "commits": max(2, files // 4), "checkpoints": max(40, count // 10)}


@contextlib.contextmanager
def history(root: Path, count: int, server: str) -> Iterator[dict]:
    """The history of `count` manifests at `root` (`shape`): made unless a whole one of that shape is there with its
    instance's runs in the database, which is reused as it is (what an interrupted measure left in it taken out first); its
    Dagster instance keeps its runs and events in the database `scale_<count>` of the PostgreSQL server at `server`.
    Within the block $DAGSTER_HOME and $FACTORY_DATABASE_URL name that instance (as `factory --root ROOT`'s deployed
    profile does). Yields its record (`make_history`'s)."""
    from dagster import DagsterInstance

    from factory.cli.common import dagster_home
    from factory.data.catalog import DATABASE_ENV
    from tests.postgres import database

    wanted = shape(count)
    record = root / MADE
    made = json.loads(record.read_text()) if record.exists() else {}
    reused = {key: made.get(key) for key in wanted} == wanted
    saved = {name: os.environ.get(name) for name in ("DAGSTER_HOME", DATABASE_ENV)}
    try:
        if reused:  # and its database holds its runs (not a new, empty one: another server, a cluster made again)
            os.environ[DATABASE_ENV] = database(server, f"scale_{count}", keep=True)
            os.environ["DAGSTER_HOME"] = str(dagster_home(root))
            with DagsterInstance.get() as instance:
                reused = instance.get_run_by_id(made["run"]) is not None
        if reused:
            for extra in (root / "registry" / "manifests").glob("*/*-extra.json"):  # a measure's, interrupted (`one_more`)
                extra.unlink()
            git(root / "repo", "reset", "-q", "--hard", made["commit"])  # and the sensor tick's commits
            print(f"reusing the history of {count:,} manifests at {root} (made in {made['seconds']:.0f} s)")
        else:
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            os.environ[DATABASE_ENV] = database(server, f"scale_{count}", keep=False)
            os.environ["DAGSTER_HOME"] = str(dagster_home(root))
            made = make_history(root, wanted)
            print(f"made the history of {count:,} manifests at {root} in {made['seconds']:.0f} s")
        yield made
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def make_history(root: Path, wanted: dict[str, int]) -> dict:
    """Fill `root` with a history of the shape `wanted`, the Dagster instance $DAGSTER_HOME names too: the registry
    (`fill`, the tiny recipe's stages all published, an exported model with its files), a git repository of experiment
    files, the checkpoint and benchmark partitions with the materializations of the checkpoints and of their evaluation
    results in the registry (`record_checkpoints`) and a run of a backfill's shape on another benchmark. Its record, written last: `wanted`, the
    seconds the make took, the repository's commit, that run's id and the exported model's weights' sha256."""
    from dagster import DagsterInstance

    from assets.evaluations import EVALS_PER_RUN
    from assets.partitions import BENCHMARKS as BENCHMARK_KEYS
    from factory.atomic import write_atomic
    from factory.registry import ArtifactStore

    started = time.perf_counter()
    fill(root / "registry", wanted["manifests"])
    store = ArtifactStore(root / "registry")
    publish_tiny(store)
    weights = publish_model_files(store)
    commit = make_repository(root / "repo", wanted["files"], wanted["commits"])
    with DagsterInstance.get() as instance:
        benchmarks = [*BENCHMARKS, *(f"bench_{i:02d}" for i in range(len(BENCHMARKS), BENCHMARK_PARTITIONS))]
        instance.add_dynamic_partitions(BENCHMARK_KEYS, benchmarks)
        keys = record_checkpoints(instance, root, wanted["checkpoints"], store)
        run = backfill_like_run(instance, [f"{benchmarks[-1]}|{key}" for key in keys[:EVALS_PER_RUN]])
    made = {**wanted, "seconds": time.perf_counter() - started, "commit": commit, "run": run, "weights": weights}
    write_atomic(root / MADE, json.dumps(made, indent=2))
    return made


def make_repository(repo: Path, files: int, commits: int) -> str:
    """A git repository of `files` experiment files (the tiny recipe, and variants extending it) that came in `commits`
    commits; its last commit."""
    experiments = repo / "experiments"
    experiments.mkdir(parents=True)
    git(repo, "init", "-q")
    (experiments / "base.md").write_text((ROOT / "experiments" / "tiny-code-lm.md").read_text())
    variants = files - 1
    for commit in range(commits):
        first, last = commit * variants // commits, (commit + 1) * variants // commits
        for i in range(first, last):
            (experiments / f"e{i:05d}.md").write_text(f"---\nextends: base.md\nseed: {i}\n---\nVariant {i}.\n")
        git(repo, "add", ".")
        git(repo, "commit", "-qm", f"variants {first} to {last}", "--allow-empty")
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=b@b", "-c", "user.name=b", *args], cwd=repo, check=True, capture_output=True)


BENCHMARK_PARTITIONS = 20
"""Benchmark partitions of a history's Dagster instance (two of them `BENCHMARKS`)."""


def backfill_like_run(instance: object, partitions: list[str]) -> str:
    """A run in `instance` shaped as one of `factory evals backfill`'s: one step that reports a materialization of each
    `evaluations` partition of its range, with a log line each; its run id."""
    from dagster import AssetMaterialization, job, op

    @op
    def evaluate(context) -> None:
        for partition in partitions:
            context.log.info(f"scored {partition}")
            context.log_event(AssetMaterialization("evaluations", partition=partition))

    @job
    def evaluations_range() -> None:
        evaluate()

    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}  # its events are in the instance, not on the terminal
    return evaluations_range.execute_in_process(instance=instance, run_config=quiet).run_id


def record_checkpoints(instance: object, root: Path, checkpoints: int, store: object) -> list[str]:
    """The registry's first `checkpoints` checkpoints as partitions of `instance`, each materialized once with the metadata
    a training stage records (its bytes in one file under `root` that exists), and each of the registry's evaluation
    results of them as a materialization of its `evaluations` partition, in runs as the stages record them; their keys."""
    from dagster import AssetMaterialization, job, op

    from assets.partitions import CHECKPOINTS
    from factory.config import load, plan_stage

    tiny = load(ROOT / "experiments" / "tiny-code-lm.md")
    training = plan_stage(tiny, "pretrain", {"blend": "b" * 64, "tokenizer": "c" * 64}).to_json()
    trained = [kind for kind, _ in BLOCK if kind in ("pretrain", "sft", "rl")]
    keys = [f"exp-{block}__{stage}-{step:06d}" for block in range(-(-checkpoints // (len(trained) * len(STEPS))))
            for stage in trained for step in STEPS][:checkpoints]
    instance.add_dynamic_partitions(CHECKPOINTS, keys)
    wanted = set(keys)
    results = [(result.summary["benchmark"], result.summary["checkpoint"], result.digest) for result in store.manifests("evaluations")
               if result.summary.get("checkpoint") in wanted]
    stored = root / "step.pt"
    stored.write_bytes(b"weights")

    @op
    def record(context) -> None:
        for i, key in enumerate(keys):
            context.log_event(AssetMaterialization(CHECKPOINTS, partition=key, metadata={
                "step": int(key[-6:]), "tokens_seen": 1000 * int(key[-6:]), "path": str(stored), "sha256": f"{i:064x}", "training": training,
                "eval": {"max_bytes": 1000, "batch_size": 8, "primary": None}, "git_commit": "f" * 40, "experiment": key.split("__")[0]}))

    @op
    def evaluate(context) -> None:
        for benchmark, checkpoint, digest in results:
            context.log_event(AssetMaterialization("evaluations", partition=f"{benchmark}|{checkpoint}", metadata={"result": digest}))

    @job
    def training_runs() -> None:
        record()

    @job
    def evaluation_runs() -> None:
        evaluate()

    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    assert training_runs.execute_in_process(instance=instance, run_config=quiet).success
    assert evaluation_runs.execute_in_process(instance=instance, run_config=quiet).success
    return keys
