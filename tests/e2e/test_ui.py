"""`make ui`: `dagster dev` on the run's instance serves the lineage, the partition and the metadata."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 180
QUERY = """
{
  assetNodes { assetKey { path } dependencyKeys { path } isPartitioned }
  assetOrError(assetKey: {path: ["model"]}) {
    ... on Asset { assetMaterializations(limit: 1) { partition metadataEntries { label } } }
  }
}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["data"]


@pytest.fixture(scope="module")
def ui(pipeline, tmp_path_factory):
    """`factory ui` (what `make ui` runs) on the pipeline's root; yields its port."""
    port = free_port()
    log = tmp_path_factory.mktemp("ui") / "dagster-dev.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "factory", "ui", "--root", str(pipeline["root"]), "--port", str(port)],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                if graphql(port, "{ assetNodes { id } }")["assetNodes"]:
                    break
            except (urllib.error.URLError, ConnectionError, KeyError, TypeError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"dagster dev did not serve the code location:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield port
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def test_ui_shows_lineage_partition_and_metadata(ui, pipeline):
    data = graphql(ui, QUERY)
    parents = {tuple(n["assetKey"]["path"])[0]: {d["path"][0] for d in n["dependencyKeys"]} for n in data["assetNodes"]}
    assert parents["best_model"] == {"leaderboard"}
    assert parents["leaderboard"] == {"evaluations"}
    assert parents["evaluations"] == {"checkpoints"}
    assert parents["model"] == {"pretrain", "sft", "rl", "tokenizer"}
    assert parents["rl"] == {"blend", "tokenizer", "pretrain", "sft", "code_exec_tasks"}
    assert parents["pretrain"] == {"blend", "tokenizer"}
    assert parents["checkpoints"] == {"pretrain", "sft", "rl"}
    assert parents["tokenizer"] == {"blend"}
    assert parents["blend"] == {"filtered_datasets"}
    assert parents["filtered_datasets"] == {"deduped_datasets"}
    assert parents["deduped_datasets"] == {"raw_datasets"}
    partitioned = {n["assetKey"]["path"][0]: n["isPartitioned"] for n in data["assetNodes"]}
    assert partitioned["evaluations"] and not partitioned["leaderboard"]
    [latest] = data["assetOrError"]["assetMaterializations"]
    assert latest["partition"] == pipeline["name"]
    labels = {entry["label"] for entry in latest["metadataEntries"]}
    assert {"digest", "git_commit", "config_hash", "summary/parameters"} <= labels
