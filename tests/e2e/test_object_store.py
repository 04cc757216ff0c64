"""The factory on an object store: `FACTORY_STORE` pointing at a real S3 server process (moto's, `tests/s3server.py`),
one experiment through Dagster end to end. Every artifact and table file is in the bucket and none under the local root;
a second run computes nothing; Podium browses and generates from the bucket; the Dagster UI's GraphQL shows the
checkpoints in it; lineage and `data batch` read it; the model reproduces from it and is promoted in it; the
leaderboard reads it; `registry verify` names a changed object; an object deleted from the bucket is found by `plan` and
computed again. The endpoint goes away twice while a training saves its checkpoints there: for a few seconds, which the
run waits out, and for longer than `FACTORY_STORE_OUTAGE_S`, which fails the run saying so; the rerun resumes from the
last checkpoint the bucket holds."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from factory.registry.objects import ObjectRegistry
from factory.storage import open_store
from tests.conftest import publish_model, publish_result
from tests.forked import factory_command
from tests.s3server import running_s3
from tests.test_cli import small_experiment

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def factory(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return factory_command(*args, env=env, timeout_s=600)


CHECKPOINTS_PAGE = """
query CheckpointsPage($keys: [String!]) {
  assetNodeOrError(assetKey: {path: ["checkpoints"]}) {
    ... on AssetNode {
      partitionKeys
      partitionStats { numMaterialized numPartitions }
      latestMaterializationByPartition(partitions: $keys) { partition runId metadataEntries { label ... on PathMetadataEntry { path } } }
    }
  }
}
"""
"""What the Dagster UI's page of the `checkpoints` asset asks: its partitions, and the metadata of the newest
materialization of each of `keys`."""
RUN_STATUS = "query RunStatus($runId: ID!) { runOrError(runId: $runId) { __typename ... on Run { status } } }"


@contextlib.contextmanager
def dagster_ui(root: Path) -> Iterator[Callable[[str, dict], dict]]:
    """The Dagster UI's GraphQL on the instance under `root`, its code location (assets.definitions) loaded in this process
    as the webserver's code server loads it, in this process's environment: yields `ask(query, variables)`, its data."""
    from dagster import DagsterInstance
    from dagster._core.test_utils import in_process_test_workspace
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster_graphql.test.utils import execute_dagster_graphql

    def ask(query: str, variables: dict) -> dict:
        result = execute_dagster_graphql(context, query, variables)
        assert not result.errors, result.errors
        return result.data

    origin = LoadableTargetOrigin(module_name="assets.definitions", attribute="defs", working_directory=str(REPO))
    with DagsterInstance.from_config(str(root / "dagster")) as instance, in_process_test_workspace(instance, origin) as context:
        yield ask


def run_through_outage(server, registry: ObjectRegistry, args: list[str], env: dict[str, str],
                       outage_s: float) -> tuple[subprocess.CompletedProcess, bool]:
    """`factory ARGS`, its endpoint taken away for `outage_s` seconds once a training has saved a checkpoint in the
    bucket (its work directory's first objects); whether the run was still going when the endpoint came back."""
    process = subprocess.Popen([sys.executable, "-m", "factory", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    while not registry.store.list("work/"):
        assert process.poll() is None, f"the run ended before a checkpoint was in the bucket:\n{process.communicate()[1][-3000:]}"
        time.sleep(0.1)
    server.kill()
    try:
        time.sleep(outage_s)
        going = process.poll() is None
    finally:
        server.restart()
    stdout, stderr = process.communicate(timeout=600)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), going


def test_an_experiment_runs_with_every_artifact_and_table_in_the_bucket_and_reruns_from_it(tmp_path, monkeypatch):
    path, root = small_experiment(tmp_path), tmp_path / "state"
    path.write_text(path.read_text().replace("steps: 100000", "steps: 200"))  # a checkpoint in the bucket every 20 steps
    with running_s3() as server:
        for name, value in {**server.env(), "FACTORY_STORE": server.url}.items():
            monkeypatch.setenv(name, value)
        env = {**os.environ, "FACTORY_TRACKER": "none"}
        registry = ObjectRegistry(open_store(f"{server.url}/registry"), tmp_path / "reader")
        run, going = run_through_outage(server, registry, ["run", str(path), "--root", str(root)], env, outage_s=3)  # the default: 60 s
        assert run.returncode == 0, run.stderr[-3000:]
        assert going, "the run had finished when the endpoint came back: the outage tested nothing"
        assert f"artifacts: {server.url}/registry/objects" in run.stdout
        assert f"tables in {server.url}/warehouse" in run.stdout
        assert f"{server.url}/registry/objects/" in run.stderr  # the stage table shows where each artifact is: the bucket

        kinds = {m.kind: m for m in registry.manifests()}
        assert {"raw_datasets", "deduped_datasets", "filtered_datasets", "blend", "tokenizer", "pretrain", "model"} <= kinds.keys()
        assert all(registry.lookup(m.fingerprint, rehash=True) == m for m in kinds.values())
        assert any(name.startswith("checkpoints/") or name.endswith(".pt") for name in kinds["pretrain"].files)
        tables = open_store(f"{server.url}/warehouse").list()
        assert any(key.endswith(".parquet") for key in tables) and any(key.endswith(".metadata.json") for key in tables)
        local = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
        assert not [p for p in local if p.startswith(("registry/objects/", "registry/manifests/", "iceberg/warehouse/"))], local
        assert not [p for p in local if p.endswith(".parquet")]

        plan = factory("plan", str(path), "--root", str(root), "--json", env=env)
        assert plan.returncode == 0, plan.stderr[-3000:]
        assert {s["kind"]: s["status"] for s in json.loads(plan.stdout)["stages"]} == {kind: "cached" for kind in
                                                                                         {s["kind"] for s in json.loads(plan.stdout)["stages"]}}

        # Podium browses a table in the bucket and generates from a checkpoint in it.
        from starlette.testclient import TestClient

        from factory.podium.app import create_app
        from factory.podium.generate import candidates

        table = json.loads((registry.open(kinds["filtered_datasets"].digest) / "datasets.json").read_text())["src"]["table"]
        podium = TestClient(create_app(root), base_url="http://127.0.0.1:8765", headers={"origin": "http://127.0.0.1:8765"})
        page = podium.get(f"/t/{table}")
        assert page.status_code == 200 and "rows 1–" in page.text
        [checkpoint, *_] = candidates(registry)
        completion = podium.post("/generate", data={"ckpt": checkpoint.sha256, "prompt": "def main():\n", "new_tokens": "8"})
        assert completion.status_code == 200 and completion.text.count('class="completion"') == 1

        # The Dagster UI answers what its pages ask of a run on the bucket (its code location loaded with FACTORY_STORE set,
        # its GraphQL asked in this process; the instance's events stay on local disk): the checkpoints' partitions, the
        # newest record of each naming its bytes in the bucket, and the page of the run that made them.
        with dagster_ui(root) as ask:
            keys = ask(CHECKPOINTS_PAGE, {"keys": []})["assetNodeOrError"]["partitionKeys"]
            checkpoints = ask(CHECKPOINTS_PAGE, {"keys": keys})["assetNodeOrError"]
            assert keys and checkpoints["partitionStats"]["numMaterialized"] == len(keys), checkpoints
            newest = checkpoints["latestMaterializationByPartition"]
            paths = [entry["path"] for event in newest for entry in event["metadataEntries"] if entry["label"] == "path"]
            assert len(paths) == len(keys) and all(path.startswith(f"{server.url}/registry/objects/") for path in paths), paths
            assert ask(RUN_STATUS, {"runId": newest[0]["runId"]})["runOrError"] == {"__typename": "Run", "status": "SUCCESS"}

        # Lineage reads the data stages' records from the bucket; a batch training read is fetched again from it.
        up = factory("lineage", kinds["model"].digest[:12], "--json", "--root", str(root), env=env)
        assert up.returncode == 0, up.stderr[-3000:]
        written = json.dumps(json.loads(up.stdout))
        assert table in written and kinds["pretrain"].digest in written
        batch = factory("data", "batch", str(path), "7", "--root", str(root), "--json", env=env)
        assert batch.returncode == 0, batch.stderr[-3000:]
        assert json.loads(batch.stdout)["step"] == 7 and json.loads(batch.stdout)["sequences"]
        copies = root / "registry" / "cache" / "objects"
        assert not (copies / kinds["pretrain"].digest).exists()  # Podium, lineage and the batch read its small files alone

        # The model reproduces from the bucket byte for byte, then is promoted there (an alias's history written by
        # conditional writes) and the leaderboard reads the bucket.
        model = kinds["model"]
        same = factory("reproduce", model.digest[:12], "--json", "--root", str(root), env=env)
        assert same.returncode == 0, same.stderr[-3000:]
        assert json.loads(same.stdout)["matched"]
        promoted = factory("promote", model.digest[:12], "--experiments", str(path.parent), "--reason", "first release",
                           "--root", str(root), env=env)
        assert promoted.returncode == 0, promoted.stderr[-3000:]
        assert "reproduction 1 matched" in promoted.stdout
        history = factory("promotions", "--json", "--root", str(root), env=env)
        assert json.loads(history.stdout)["model"] == model.digest
        assert any(key.startswith("history/promotions/production/") for key in registry.store.list("history/"))
        scored = publish_model(registry, "scored")
        publish_result(registry, "scored", "val_bpb", 1.25)
        board = factory("leaderboard", "--json", "--root", str(root), env=env)
        assert board.returncode == 0, board.stderr[-3000:]
        [row] = json.loads(board.stdout)["rows"]
        assert (row["experiment"], row["model"], row["scores"]["val_bpb"]) == ("scored", scored, 1.25), row

        # `factory registry verify` reads every object in the bucket, and names the one changed there.
        verified = factory("registry", "verify", "--root", str(root), env=env)
        assert verified.returncode == 0 and f"registry {server.url}/registry: every manifest and artifact intact" in verified.stdout
        name = sorted(model.files)[0]
        key = f"objects/{model.digest}/{name}"
        data = registry.store.get(key, limit=1 << 30).data
        registry.store.put(key, bytes([data[0] ^ 1]) + data[1:])
        verified = factory("registry", "verify", "--root", str(root), env=env)
        assert verified.returncode == 1 and f"{name}: sha256 differs from the manifest's" in verified.stdout

        pretrain = kinds["pretrain"]
        registry.store.delete(f"objects/{pretrain.digest}/{sorted(pretrain.files)[0]}")
        plan = factory("plan", str(path), "--root", str(root), "--json", env=env)
        assert {s["kind"]: s["status"] for s in json.loads(plan.stdout)["stages"]}["pretrain"] == "run"
        # The training computed again loses its endpoint for longer than its window: the run fails saying so; the rerun
        # resumes from the checkpoint it saved in the bucket before.
        cut, _ = run_through_outage(server, registry, ["run", str(path), "--root", str(root)], {**env, "FACTORY_STORE_OUTAGE_S": "1"},
                                    outage_s=4)
        [said] = [line for line in cut.stderr.splitlines() if line.startswith("error: ")]
        assert cut.returncode == 1 and said.startswith("error: pretrain: s3://factory-test/factory/registry/"), cut.stderr[-3000:]
        assert "still failing after 1 s of retries: rerun once it answers, or allow longer outages with FACTORY_STORE_OUTAGE_S" in said
        assert registry.lookup(pretrain.fingerprint, rehash=True) is None
        again = factory("run", str(path), "--root", str(root), env=env)
        assert again.returncode == 0, again.stderr[-3000:]
        resumed = re.search(r"pretrain - resuming from step_\d+\.pt at step (\d+) of 200", again.stderr)
        assert resumed and 20 <= int(resumed[1]) < 200, again.stderr[-3000:]
        assert registry.lookup(pretrain.fingerprint, rehash=True) is not None
