"""The Volcano launcher end to end, against tests/launch/fake_kube.py (a test double: no Kubernetes API server can run
here): Dagster -> Volcano Job (a ConfigMap, a gang of pods) -> torchrun ranks in each pod -> Pipes messages in the
master's log -> a materialization; evictions restart the gang, which resumes from its checkpoint; OOMKilled, an image
that cannot be pulled and a full queue end as Dagster failures that say why; a cancelled run leaves nothing behind."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance, materialize

from assets.execution import EVERYTHING, failure_messages, resources_at
from assets.partitions import BENCHMARKS, CHECKPOINTS, EXPERIMENTS
from factory.cli.common import dagster_home
from resources import VolcanoStageLauncher
from tests.launch.fake_kube import FakeCluster

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
STAGES = ["raw_datasets", "deduped_datasets", "filtered_datasets", "blend", "tokenizer", "pretrain"]
BASE = """---
extends: {tiny}
image: trainer@sha256:{digest}
data:
  datasets:
    stdlib:
      source: {{include: ["json/**/*.py"]}}
    site_packages:
      source: {{include: ["yaml/**/*.py"]}}
tokenizer:
  vocab_size: 300
  sample_bytes: 100000
model:
  n_layer: 1
  n_embd: 32
  context: 32
pretrain:
  steps: 6
  batch_size: 4
  warmup_steps: 1
  checkpoint_every: 2
  log_every: 1
resources:
  queue: research
  nodes: 2
---
Two pods of one rank each train the tiny model on the fake cluster.
"""
VARIANT = """---
extends: vc-ok.md
pretrain:
  lr: {lr}
---
"""
PROFILE = """launcher: volcano
queues:
  research: {{nodes: 4, gpus_per_node: 0}}
kubernetes:
  namespace: model-factory
  kubeconfig: {kubeconfig}
  image_registry: registry.example.com/ml
  schedule_timeout_s: 3
  poll_s: 0.2
  max_retry: 1
  evaluations: {{queue: research, image: "model-factory@sha256:{digest}"}}
"""
CODE_LOCATION_IMAGE = "cd" * 32
LRS = {"vc-oom": 0.0022, "vc-pull": 0.0023, "vc-queue": 0.0024, "vc-cancel": 0.0025}
LONGER = """---
extends: vc-ok.md
pretrain:
  steps: 120
  checkpoint_every: 50
  log_every: 10
---
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory, tiny_path):
    """The fake cluster, a profile pointing at it, experiment files and a Dagster instance; vc-ok materialized first."""
    root = tmp_path_factory.mktemp("volcano")
    experiments = root / "experiments"
    experiments.mkdir()
    (experiments / "vc-ok.md").write_text(BASE.format(tiny=tiny_path, digest="ab" * 32))
    for name, lr in LRS.items():
        (experiments / f"{name}.md").write_text(VARIANT.format(lr=lr))
    (experiments / "vc-evict.md").write_text(LONGER)  # long enough to be evicted half way
    with FakeCluster(root / "nodes") as cluster:
        profile = root / "cluster.yaml"
        profile.write_text(PROFILE.format(kubeconfig=cluster.kubeconfig(root / "kubeconfig"), digest=CODE_LOCATION_IMAGE))
        instance = DagsterInstance.from_config(str(dagster_home(root / "state")))
        site = {"root": root, "experiments": experiments, "profile": profile, "cluster": cluster, "instance": instance}
        site["ok"] = run(site, "vc-ok")
        # each pod a cold start instead (seconds of imports per process) would make this module minutes longer
        assert cluster.starts["cold"] == 0 < cluster.starts["forked"], f"pods started cold: {cluster.warm and cluster.warm.refused}"
        yield site


def run(site: dict, name: str):
    instance = site["instance"]
    if not instance.has_dynamic_partition(EXPERIMENTS, name):
        instance.add_dynamic_partitions(EXPERIMENTS, [name])
    resources = {**resources_at(site["root"] / "state", site["experiments"]), "launcher": VolcanoStageLauncher(profile=str(site["profile"]))}
    return materialize(EVERYTHING, selection=STAGES, partition_key=name, instance=instance, resources=resources, raise_on_error=False)


def jobs_posted(cluster: FakeCluster, experiment: str, stage: str) -> list[str]:
    """The Jobs submitted for one stage of one experiment (the other tests of this module share the cluster)."""
    return [name for method, name in cluster.requests if method == "POST" and name.startswith(f"jobs/{experiment}-{stage}-")]


def stage_metadata(result, stage: str = "pretrain") -> dict:
    [found] = [m for m in result.asset_materializations_for_node(stage) if m.asset_key.to_user_string() == stage]
    return found.metadata


def logs(site: dict, result) -> str:
    return "\n".join(event.user_message for event in site["instance"].all_logs(result.run_id))


def leaves_nothing(cluster: FakeCluster) -> None:
    assert cluster.names("jobs") == [] and cluster.names("configmaps") == [] and cluster.names("pods") == []
    assert cluster.running_processes() == 0


def test_every_stage_runs_as_a_volcano_job_and_reports_through_pipes(site):
    result, cluster = site["ok"], site["cluster"]
    assert result.success, failure_messages(result)
    assert {stage: len(jobs_posted(cluster, "vc-ok", stage.replace("_", "-"))) for stage in STAGES} == dict.fromkeys(STAGES, 1)
    [job] = jobs_posted(cluster, "vc-ok", "pretrain")
    pods = [name for method, name in cluster.requests if name.startswith(f"log/{job.removeprefix('jobs/')}")]
    assert pods, "the launcher followed the master pod's log"
    leaves_nothing(cluster)
    pretrain = stage_metadata(result)
    assert pretrain["summary/steps"].value == 6 and "metrics" in pretrain, "the stage's report and metrics came back through Pipes"
    assert pretrain["summary/ranks"].value == 2, "two pods, one rank each: one torchrun world"
    keys = site["instance"].get_dynamic_partitions(CHECKPOINTS)
    assert "vc-ok__pretrain-000006" in keys
    stored = [record.asset_materialization.metadata["stored"].value for record in site["instance"].fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(CHECKPOINTS), asset_partitions=["vc-ok__pretrain-000006"]), limit=10).records]
    assert "training (may be deleted by retention)" in stored, "the checkpoint's message came back in the master pod's log"
    text = logs(site, result)
    assert "submitted Volcano Job" in text and "Running" in text


def test_an_evaluation_batch_is_a_volcano_job_in_the_code_locations_image(site):
    cluster, instance = site["cluster"], site["instance"]
    assert site["ok"].success
    instance.add_dynamic_partitions(BENCHMARKS, ["val_bpb"])
    resources = {**resources_at(site["root"] / "state", site["experiments"]), "launcher": VolcanoStageLauncher(profile=str(site["profile"]))}
    key = "val_bpb|vc-ok__pretrain-000004"
    first = materialize(EVERYTHING, selection=["evaluations"], partition_key=key, instance=instance, resources=resources, raise_on_error=False)
    assert first.success, failure_messages(first)
    [job] = [name for method, name in cluster.requests if method == "POST" and name.startswith("jobs/evaluations-evaluation-")]
    manifest = cluster.posted[job.removeprefix("jobs/")]
    assert manifest["spec"]["queue"] == "research"
    images = {c["image"] for task in manifest["spec"]["tasks"] for c in task["template"]["spec"]["containers"]}
    assert images == {f"registry.example.com/ml/model-factory@sha256:{CODE_LOCATION_IMAGE}"}
    [batch] = [m for m in first.asset_materializations_for_node("evaluations")]
    assert batch.metadata["summary/evaluated"].value == 1 and batch.metadata["cache"].value == "miss"
    observed = first.asset_observations_for_node("evaluations")
    assert [o.partition for o in observed] == [key] and observed[0].metadata["value"].value > 0
    leaves_nothing(cluster)


def test_an_evicted_gang_restarts_and_resumes_from_its_checkpoint(site):
    cluster = site["cluster"]
    cluster.inject("evict", job="vc-evict-pretrain", after=r"step 60/120")
    result = run(site, "vc-evict")
    assert result.success, failure_messages(result)
    [job] = jobs_posted(cluster, "vc-evict", "pretrain")
    assert cluster.attempts[job.removeprefix("jobs/")] == 2
    metadata = stage_metadata(result)
    assert 50 <= metadata["summary/resumed_from_step"].value < 120 and metadata["summary/steps"].value == 120, attempt_logs(cluster, job)
    assert "(restart 1)" in logs(site, result)
    leaves_nothing(cluster)


def attempt_logs(cluster: FakeCluster, job: str) -> str:
    """The last lines of every container the Job's attempts ran, oldest first: what a failure of the test shows."""
    found = sorted(cluster.root.glob(f"*/{job.removeprefix('jobs/')}-*/*/container.log"), key=lambda log: log.stat().st_mtime)
    return "\n".join(f"--- {log.relative_to(cluster.root)}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:]) for log in found)


def failed_with(site: dict, fault: str, name: str, times: int = 1, after: str | None = None):
    """Run experiment `name` with `fault` injected into its pretrain Job (once its master logged `after`): the pretrain step's
    failure message, and the run."""
    site["cluster"].inject(fault, job=f"{name}-pretrain", times=times, after=after)
    result = run(site, name)
    [message] = [m for m in failure_messages(result) if m.startswith("pretrain")]
    leaves_nothing(site["cluster"])
    return message, result


def test_an_oom_killed_stage_fails_saying_so_with_the_masters_last_lines(site):
    # Every attempt (the first and max_retry's one restart), once its master logged a step (any: the restart resumes from
    # the first attempt's checkpoint when it got to save one). Its first line is Pipes' opening message, which the failure
    # does not quote: a kill right after it would leave no line to quote.
    message, _ = failed_with(site, "oom", "vc-oom", times=10, after=r"step \d+/")
    assert "OOMKilled" in message and "after 1 restart (maxRetry 1)" in message and "last lines of the master pod's log" in message


def test_an_image_that_cannot_be_pulled_fails_at_once_naming_it(site):
    message, _ = failed_with(site, "image_pull", "vc-pull")
    assert "ImagePullBackOff" in message and f"registry.example.com/ml/trainer@sha256:{'ab' * 32}" in message


def test_a_stage_the_queue_cannot_hold_reports_why_then_gives_up(site):
    message, result = failed_with(site, "unschedulable", "vc-queue")
    assert "not scheduled within 3 s in queue research" in message and "queue research is full" in message
    assert "Pending: vc-queue-pretrain" in logs(site, result) and "not scheduled: queue research is full" in logs(site, result)


CANCEL = textwrap.dedent("""
    import sys
    from pathlib import Path
    from dagster import DagsterInstance
    sys.path.insert(0, sys.argv[1])
    from tests.launch.test_volcano_cluster import run
    root, experiments, profile = Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    from factory.cli.common import dagster_home
    instance = DagsterInstance.from_config(str(dagster_home(root / "state")))
    run({"root": root, "experiments": experiments, "profile": profile, "instance": instance}, "vc-cancel")
""")


def test_a_cancelled_run_deletes_its_job(site, tmp_path):
    cluster = site["cluster"]
    script = tmp_path / "cancel.py"
    script.write_text(CANCEL)
    process = subprocess.Popen([sys.executable, str(script), str(REPO), str(site["root"]), str(site["experiments"]), str(site["profile"])],
                               env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not any(name.startswith("vc-cancel-pretrain") for name in cluster.names("pods")) or cluster.running_processes() < 2:
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read() if process.poll() is not None else "timed out"
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)  # what Dagster sends a step's process when its run is cancelled
    _, err = process.communicate(timeout=120)
    assert cluster.names("jobs") == [], err[-3000:]
    leaves_nothing(cluster)
    assert [m for m, name in cluster.requests if m == "DELETE" and name.startswith("jobs/vc-cancel-pretrain")]
