"""Volcano Jobs: the builder's manifests, each pre-submit rule refusing a manifest that breaks it (the pod
templates against the real Kubernetes schemas), and `factory run --launcher volcano --dry-run`."""

import copy
import functools
import subprocess
from collections.abc import Callable

import pytest
import yaml

from factory.config import load
from factory.config.stages import stages_of
from factory.errors import ConfigError
from factory.launch.volcano import RULES, JobSpec, build_job, job_manifest, job_name, label_value, validate
from factory.launch.volcano_manifest import DNS1035_LABEL, LABEL_VALUE
from factory.launch.volcano_rules import check_pod_templates
from tests.forked import factory_command

IMAGE = "registry.example/factory@sha256:" + "ab" * 32
FINGERPRINT = "0123456789abcdef" * 4
TORCHRUN_2 = ("torchrun --nnodes=$(WORLD_SIZE) --node_rank=$(RANK) --nproc_per_node=2 --master_addr=$(MASTER_ADDR) "
              "--master_port=$(MASTER_PORT) -m factory.runtime /var/run/factory/request.json")


def job_spec(**changes) -> JobSpec:
    return JobSpec(**{"experiment": "tiny-code-lm", "stage": "pretrain", "fingerprint": FINGERPRINT, "image": IMAGE, **changes})


@functools.cache
def _gang() -> dict:
    return job_manifest(job_spec(nodes=3, processes_per_node=2, gpus=1, cpu="4", memory="16Gi", queue="research", priority="high"))


def gang() -> dict:
    """3 nodes x 2 processes x 1 GPU: a master and two workers (validated once, a fresh copy each time)."""
    return copy.deepcopy(_gang())


def container(manifest: dict, task: int = 0) -> dict:
    return manifest["spec"]["tasks"][task]["template"]["spec"]["containers"][0]


def test_one_node_is_a_master_task_alone():
    manifest = job_manifest(job_spec())
    spec = manifest["spec"]
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch.volcano.sh/v1alpha1", "Job")
    assert [(t["name"], t["replicas"]) for t in spec["tasks"]] == [("master", 1)]
    assert (spec["schedulerName"], spec["queue"], spec["minAvailable"], spec["maxRetry"]) == ("volcano", "default", 1, 3)
    assert "priorityClassName" not in spec and spec["ttlSecondsAfterFinished"] == 3600
    assert spec["plugins"] == {"pytorch": ["--master=master", "--worker=worker", "--port=23456"], "svc": [], "env": []}
    assert spec["policies"] == [{"event": "PodEvicted", "action": "RestartJob"}, {"event": "PodFailed", "action": "RestartJob"}]
    assert spec["tasks"][0]["policies"] == [{"event": "TaskCompleted", "action": "CompleteJob"}]
    assert container(manifest)["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}}
    assert " ".join(container(manifest)["command"]) == TORCHRUN_2.replace("nproc_per_node=2", "nproc_per_node=1")


def test_three_nodes_of_two_gpu_ranks_are_one_gang():
    manifest = gang()
    spec = manifest["spec"]
    assert spec["minAvailable"] == 3 and spec["priorityClassName"] == "high" and spec["queue"] == "research"
    assert [(t["name"], t["replicas"]) for t in spec["tasks"]] == [("master", 1), ("worker", 2)]
    assert "policies" not in spec["tasks"][1]
    for task in (0, 1):
        stage = container(manifest, task)
        pod = spec["tasks"][task]["template"]["spec"]
        assert stage["image"] == IMAGE
        assert stage["resources"]["limits"] == stage["resources"]["requests"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}
        assert " ".join(stage["command"]) == TORCHRUN_2 and "args" not in stage
        assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
        assert stage["securityContext"] == {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"]["medium"] == "Memory" and {"name": "dshm", "mountPath": "/dev/shm"} in stage["volumeMounts"]


@pytest.mark.parametrize("nodes", [1, 3])
def test_the_builder_output_passes_every_rule_and_the_schema(nodes):
    manifest = build_job(job_spec(nodes=nodes, gpus=1, env_secrets={"HF_TOKEN": ("hub", "token")}, service_account="trainer"))
    assert list(check_pod_templates(manifest)) == []
    for rule in RULES:
        assert list(rule.check(manifest)) == [], rule.name


def test_a_dollar_in_the_stage_arguments_is_not_expanded_by_kubernetes():
    manifest = job_manifest(job_spec(stage_args=("-m", "factory.runtime", "/req/$(HOME).json")))
    assert container(manifest)["command"][-1] == "/req/$$(HOME).json"


def test_credentials_are_secret_references_only():
    manifest = job_manifest(job_spec(env={"TOKENIZERS_PARALLELISM": "false"}, env_secrets={"NEPTUNE_API_TOKEN": ("tracking", "api-token")}))
    env = {entry["name"]: entry for entry in container(manifest)["env"]}
    assert env["NEPTUNE_API_TOKEN"] == {"name": "NEPTUNE_API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "tracking", "key": "api-token"}}}
    assert env["TOKENIZERS_PARALLELISM"]["value"] == "false"


@pytest.mark.parametrize("name", ["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_PASSWORD", "CLIENT_SECRET", "api_key"])
def test_a_credential_as_a_plain_value_is_refused(name):
    with pytest.raises(ConfigError, match=f"{name} look like credentials"):
        job_spec(env={name: "s3cr3t"})


def test_names_and_labels_are_sanitised_and_deterministic():
    assert job_name("grid.lr=0.001.vocab_size=512", "raw_datasets", FINGERPRINT) == "grid-lr-0-001-vocab-size-512-raw-datasets-01234567"
    assert job_name("0-shot", "sft", FINGERPRINT) == "f-0-shot-sft-01234567"
    long = job_name("x" * 200, "pretrain", FINGERPRINT)
    assert len(long) <= 50 and long.endswith("-01234567") and DNS1035_LABEL.fullmatch(long)
    assert long == job_name("x" * 200, "pretrain", FINGERPRINT)
    assert label_value("grid.lr=0.001") == "grid.lr-0.001" and label_value("_x_") == "x" and len(label_value("a" * 100)) == 63
    manifest = job_manifest(job_spec(experiment="grid.lr=0.001._" + "v" * 80))
    assert all(LABEL_VALUE.fullmatch(value) for value in manifest["metadata"]["labels"].values())
    assert manifest["metadata"]["annotations"]["model-factory/experiment"] == "grid.lr=0.001._" + "v" * 80


@pytest.mark.parametrize(("image", "message"), [("local", "only with the local launcher"), ("factory:latest", "not pinned by digest")])
def test_an_image_not_pinned_by_digest_is_refused(image, message):
    with pytest.raises(ConfigError, match=message):
        job_spec(image=image)


def _set(path: str, value) -> Callable[[dict], None]:
    """A mutation: set the dotted `path` (list indexes as numbers) of the manifest to `value`."""
    def mutate(manifest: dict) -> None:
        *parents, last = [int(part) if part.isdigit() else part for part in path.split(".")]
        target = manifest
        for part in parents:
            target = target[part]
        target[last] = value
    return mutate


def _delete(path: str) -> Callable[[dict], None]:
    def mutate(manifest: dict) -> None:
        *parents, last = path.split(".")
        target = manifest
        for part in parents:
            target = target[int(part) if part.isdigit() else part]
        del target[last]
    return mutate


def _gpu_request(manifest: dict) -> None:
    container(manifest)["resources"]["requests"]["nvidia.com/gpu"] = "2"  # its key has a dot: no `_set`


C0 = "spec.tasks.0.template.spec.containers.0"
CASES = {
    # shape
    "wrong kind": (_set("apiVersion", "batch/v1"), "apiVersion", "expected apiVersion"),
    "no tasks": (_set("spec.tasks", []), "spec.tasks", "no task specified"),
    "minAvailable not a number": (_set("spec.minAvailable", "3"), "spec.minAvailable", "expected an integer"),
    "policy not a mapping": (_set("spec.policies.0", "PodFailed"), "spec.policies[0]", "expected a policy"),
    # Kubernetes schema (strict)
    "port of the wrong type": (_set(f"{C0}.ports", [{"containerPort": "x"}]), "spec.tasks[0].template.spec.containers[0].ports[0].containerPort",
                               "'x' is not of type 'integer'"),
    "unknown pod field": (_set(f"{C0}.bogus", 1), "spec.tasks[0].template.spec.containers[0]", "'bogus' was unexpected"),
    # Volcano webhook
    "minAvailable above the pods": (_set("spec.minAvailable", 4), "spec.minAvailable", "more than the 3 pods"),
    "negative minAvailable": (_set("spec.minAvailable", -1), "spec.minAvailable", "must be >= 0"),
    "negative maxRetry": (_set("spec.maxRetry", -1), "spec.maxRetry", "must be >= 0"),
    "negative ttl": (_set("spec.ttlSecondsAfterFinished", -5), "spec.ttlSecondsAfterFinished", "must be >= 0"),
    "negative replicas": (_set("spec.tasks.1.replicas", -1), "spec.tasks[1].replicas", "must be >= 0"),
    "task minAvailable above its replicas": (_set("spec.tasks.1.minAvailable", 5), "spec.tasks[1].minAvailable", "between 0 and"),
    "task name not a label": (_set("spec.tasks.1.name", "Worker_1"), "spec.tasks[1].name", "not a DNS-1123 label"),
    "duplicate task names": (_set("spec.tasks.1.name", "master"), "spec.tasks[1].name", "duplicate task name 'master'"),
    "unknown event": (_set("spec.policies.0.event", "PodPending"), "spec.policies[0].event", "not a policy event"),
    "internal event": (_set("spec.policies.0.event", "OutOfSync"), "spec.policies[0].event", "not a policy event"),
    "internal action": (_set("spec.policies.0.action", "SyncJob"), "spec.policies[0].action", "not a policy action"),
    "duplicate event": (_set("spec.policies.1.event", "PodEvicted"), "spec.policies[1].event", "duplicate event 'PodEvicted'"),
    "duplicate event in a list": (_set("spec.policies.0", {"events": ["TaskFailed", "PodFailed"], "action": "AbortJob"}),
                                  "spec.policies[1].event", "duplicate event 'PodFailed'"),
    "* beside other events": (_set("spec.policies.0.event", "*"), "spec.policies", "'*' matches every event"),
    "event and exitCode": (_set("spec.policies.0.exitCode", 3), "spec.policies[0]", "event(s) and exitCode together"),
    "exitCode 0": (_set("spec.policies", [{"exitCode": 0, "action": "RestartJob"}]), "spec.policies[0].exitCode", "0 is not a valid"),
    "duplicate exitCode": (_set("spec.policies", [{"exitCode": 3, "action": "RestartJob"}, {"exitCode": 3, "action": "AbortJob"}]),
                           "spec.policies[1].exitCode", "duplicate exitCode 3"),
    "neither event nor exitCode": (_set("spec.policies", [{"action": "RestartJob"}]), "spec.policies[0]", "needs an event"),
    "task policy action": (_set("spec.tasks.0.policies.0.action", "Explode"), "spec.tasks[0].policies[0].action", "not a policy action"),
    "job name not a DNS-1035 label": (_set("metadata.name", "9lives"), "metadata.name", "not a DNS-1035 label"),
    "pod names too long": (_set("metadata.name", "a" * 56), "spec.tasks[1].name", "longer than 63"),
    "unknown plugin": (_set("spec.plugins.horovod", []), "spec.plugins.horovod", "unknown job plugin"),
    "queue name": (_set("spec.queue", "Research Queue"), "spec.queue", "not a queue name"),
    # Kubernetes pod validation beyond the schema
    "quantity": (_set(f"{C0}.resources.limits.memory", "16 GB"), "spec.tasks[0].template.spec.containers[0].resources.limits.memory",
                 "not a Kubernetes quantity"),
    "request above limit": (_set(f"{C0}.resources.requests.cpu", "4500m"), "spec.tasks[0].template.spec.containers[0].resources.requests.cpu",
                            "more than the limit"),
    "GPU request unlike its limit": (_gpu_request, "spec.tasks[0].template.spec.containers[0].resources.requests.nvidia.com/gpu",
                                     "extended resource"),
    "mount of no volume": (_set(f"{C0}.volumeMounts.0.name", "scratch"), "spec.tasks[0].template.spec.containers[0].volumeMounts[0].name",
                           "no volume named 'scratch'"),
    # the factory's own
    "another scheduler": (_set("spec.schedulerName", "default-scheduler"), "spec.schedulerName", "must be 'volcano'"),
    "no pytorch plugin": (_delete("spec.plugins.pytorch"), "spec.plugins.pytorch", "only the pytorch plugin sets"),
    "pytorch master renamed": (_set("spec.plugins.pytorch", ["--master=chief", "--worker=worker"]), "spec.tasks", "master task 'chief' is missing"),
    "task unknown to pytorch": (_set("spec.tasks.1.name", "helper"), "spec.tasks[1].name", "neither the pytorch plugin's master"),
    "no svc plugin": (_delete("spec.plugins.svc"), "spec.plugins.svc", "headless Service"),
    "local image": (_set(f"{C0}.image", "local"), "spec.tasks[0].template.spec.containers[0].image", "only with the local launcher"),
    "unpinned image": (_set(f"{C0}.image", "factory:latest"), "spec.tasks[0].template.spec.containers[0].image", "not pinned by digest"),
    "inline credential": (_set(f"{C0}.env.1", {"name": "HF_TOKEN", "value": "hf_abc"}), "spec.tasks[0].template.spec.containers[0].env[1].value",
                          "HF_TOKEN looks like a credential"),
}


@pytest.mark.parametrize("case", CASES)
def test_each_rule_refuses_a_manifest_that_breaks_it_naming_the_field(case):
    mutate, path, message = CASES[case]
    manifest = gang()  # passes validation unbroken
    mutate(manifest)
    with pytest.raises(ConfigError) as refused:
        validate(manifest)
    assert f"  {path}: " in str(refused.value) and message in str(refused.value), str(refused.value)
    assert str(refused.value).startswith(f"Volcano Job {manifest['metadata']['name']!r} would be refused:")


def factory(*args: str) -> subprocess.CompletedProcess:
    return factory_command(*args)


def test_dry_run_prints_a_validated_job_for_every_stage(tiny_path, tmp_path):
    pinned = tmp_path / "pinned.md"
    pinned.write_text(f"---\nextends: {tiny_path.resolve()}\nimage: {IMAGE}\n---\nThe tiny recipe in a pinned image.\n")
    result = factory("run", str(pinned), "--launcher", "volcano", "--dry-run", "--root", str(tmp_path / "state"))
    assert result.returncode == 0, result.stderr
    jobs = list(yaml.safe_load_all(result.stdout))
    assert [job["metadata"]["labels"]["model-factory/stage"] for job in jobs] == list(stages_of(load(pinned)))
    for job in jobs:
        assert (job["apiVersion"], job["kind"], job["metadata"]["labels"]["model-factory/experiment"]) == ("batch.volcano.sh/v1alpha1", "Job", "pinned")
        validate(job)
    assert len({job["metadata"]["name"] for job in jobs}) == len(jobs)
    assert not (tmp_path / "state").exists()


def test_volcano_refuses_a_local_image_and_a_run_without_a_cluster_profile(tiny_path, tmp_path):
    local = factory("run", str(tiny_path), "--launcher", "volcano", "--dry-run")
    assert local.returncode == 2 and "only with the local launcher" in local.stderr and "Traceback" not in local.stderr
    submit = factory("run", str(tiny_path), "--launcher", "volcano", "--root", str(tmp_path / "state"))
    assert submit.returncode == 2 and "needs a cluster profile" in submit.stderr and "Traceback" not in submit.stderr
    profile = tmp_path / "cluster.yaml"
    profile.write_text("launcher: volcano\nqueues:\n  default: {nodes: 2}\n")
    bare = factory("run", str(tiny_path), "--launcher", "volcano", "--cluster", str(profile), "--root", str(tmp_path / "state"))
    assert bare.returncode == 2 and "a `kubernetes:` section" in bare.stderr
    profile.write_text(profile.read_text() + "kubernetes: {namespace: ml}\n")
    pinned = factory("run", str(tiny_path), "--launcher", "volcano", "--cluster", str(profile), "--root", str(tmp_path / "state"))
    assert pinned.returncode == 2 and "only with the local launcher" in pinned.stderr
    assert not (tmp_path / "state").exists()


def test_plan_prints_the_jobs_of_the_stages_that_would_run_placed_on_the_profiles_cluster(tiny_path, tmp_path):
    pinned = tmp_path / "pinned.md"
    pinned.write_text(f"---\nextends: {tiny_path.resolve()}\nimage: trainer@sha256:{'c' * 64}\n---\n")
    profile = tmp_path / "cluster.yaml"
    profile.write_text("launcher: volcano\nqueues:\n  default: {nodes: 2}\nkubernetes:\n  namespace: ml\n  image_registry: registry.example.com/team\n"
                       "  storage: {claim: factory-store, mount_path: /store}\n  env_secrets: {NEPTUNE_API_TOKEN: {secret: neptune, key: token}}\n")
    result = factory("plan", str(pinned), "--launcher", "volcano", "--cluster", str(profile), "--root", str(tmp_path / "state"))
    assert result.returncode == 0, result.stderr
    jobs = list(yaml.safe_load_all(result.stdout[result.stdout.index("apiVersion:"):]))
    assert [job["metadata"]["labels"]["model-factory/stage"] for job in jobs] == list(stages_of(load(pinned)))
    for job in jobs:
        validate(job)
        pod = job["spec"]["tasks"][0]["template"]["spec"]
        container = pod["containers"][0]
        assert job["metadata"]["namespace"] == "ml"
        assert container["image"] == f"registry.example.com/team/trainer@sha256:{'c' * 64}"
        assert {"name": "store", "persistentVolumeClaim": {"claimName": "factory-store"}} in pod["volumes"]
        assert {"name": "store", "mountPath": "/store"} in container["volumeMounts"]
        assert {"name": "NEPTUNE_API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "neptune", "key": "token"}}} in container["env"]


def test_with_an_object_store_in_the_profile_the_pods_get_it_and_its_credentials_as_secret_references(tiny_path, tmp_path):
    pinned = tmp_path / "pinned.md"
    pinned.write_text(f"---\nextends: {tiny_path.resolve()}\nimage: trainer@sha256:{'c' * 64}\n---\n")
    profile = tmp_path / "cluster.yaml"
    profile.write_text("launcher: volcano\nqueues:\n  default: {nodes: 2}\nkubernetes:\n  namespace: ml\n"
                       "  store: {uri: 's3://team-bucket/factory', endpoint: 'https://s3.example.com', region: eu-west-1}\n"
                       "  env_secrets:\n    AWS_ACCESS_KEY_ID: {secret: factory-s3, key: id}\n"
                       "    AWS_SECRET_ACCESS_KEY: {secret: factory-s3, key: secret}\n")
    result = factory("plan", str(pinned), "--launcher", "volcano", "--cluster", str(profile), "--root", str(tmp_path / "state"))
    assert result.returncode == 0, result.stderr
    for job in yaml.safe_load_all(result.stdout[result.stdout.index("apiVersion:"):]):
        validate(job)
        pod = job["spec"]["tasks"][0]["template"]["spec"]
        env = pod["containers"][0]["env"]
        assert {"name": "FACTORY_STORE", "value": "s3://team-bucket/factory"} in env
        assert {"name": "AWS_ENDPOINT_URL", "value": "https://s3.example.com"} in env and {"name": "AWS_REGION", "value": "eu-west-1"} in env
        assert {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "factory-s3", "key": "secret"}}} in env
        assert not [v for v in pod["volumes"] if "persistentVolumeClaim" in v]  # no shared volume: the pods use the store

    profile.write_text(profile.read_text().replace("s3://team-bucket/factory", "gs://team-bucket/factory"))
    result = factory("plan", str(pinned), "--launcher", "volcano", "--cluster", str(profile), "--root", str(tmp_path / "state"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{profile}:6" in result.stderr and "gs:// is no object store the factory knows; known: s3://" in result.stderr, result.stderr


def test_the_code_location_picks_the_volcano_launcher_from_the_profile_in_the_environment(tmp_path, monkeypatch):
    from resources import StageLauncher, VolcanoStageLauncher, launcher_from_env

    profile = tmp_path / "cluster.yaml"
    profile.write_text("launcher: volcano\nqueues:\n  default: {nodes: 2}\nkubernetes: {namespace: ml, max_retry: 1}\n")
    monkeypatch.delenv("FACTORY_CLUSTER", raising=False)
    assert type(launcher_from_env()) is StageLauncher
    monkeypatch.setenv("FACTORY_CLUSTER", str(profile))
    chosen = launcher_from_env()
    assert isinstance(chosen, VolcanoStageLauncher) and chosen.settings().namespace == "ml" and chosen.settings().max_retry == 1
    profile.write_text("launcher: local\nqueues:\n  default: {nodes: 1}\n")
    assert type(launcher_from_env()) is StageLauncher


def test_an_evaluation_batch_runs_in_the_code_locations_image_or_says_which_to_set():
    from factory.config.cluster import KubernetesSettings
    from factory.launch.volcano import batch_job_spec
    from factory.stages.evaluation import batch_spec

    stage = batch_spec((), "local:test")
    pinned = "model-factory@sha256:" + "c" * 64
    settings = KubernetesSettings(image_registry="registry.example.com/ml", evaluations={"queue": "cpu", "gpus": 1})
    spec = batch_job_spec(stage, settings, pinned)  # the Dagster run's own image ($DAGSTER_CURRENT_IMAGE)
    assert (spec.image, spec.queue, spec.gpus, spec.experiment) == (f"registry.example.com/ml/{pinned}", "cpu", 1, "evaluations")
    assert job_manifest(spec)["spec"]["queue"] == "cpu"
    named = KubernetesSettings(evaluations={"image": "evaluator@sha256:" + "d" * 64})
    assert batch_job_spec(stage, named, pinned).image == "evaluator@sha256:" + "d" * 64  # the profile's choice wins
    with pytest.raises(ConfigError, match="no image to run it in: set kubernetes.evaluations.image"):
        batch_job_spec(stage, KubernetesSettings(), None)
    with pytest.raises(ConfigError, match="image 'model-factory:dev'.*set kubernetes.evaluations.image"):
        batch_job_spec(stage, KubernetesSettings(), "model-factory:dev")
