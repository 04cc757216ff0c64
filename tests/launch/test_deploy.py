"""deploy/: every Kubernetes object validates against the real schemas, the Volcano queues are well formed, the Ray
cluster is a RayCluster whose pods validate and that the profile and the image agree with, and the files agree with
each other and with the cluster profile `factory check --cluster` reads."""

import copy
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from factory.config.cluster import load_profile
from factory.launch.volcano import JobSpec, job_manifest
from factory.launch.volcano_manifest import DNS1035_LABEL
from factory.launch.volcano_rules import KUBERNETES_VERSION, parse_quantity

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
QUEUE_FIELDS = {"weight", "reclaimable", "capability"}
CUSTOM_KINDS = {"Queue", "RayCluster"}
"""Kinds of the operators' own resources (Volcano's, KubeRay's), which the Kubernetes schemas do not hold: checked below."""
RAY_GROUP_FIELDS = {"groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams", "template"}


def documents() -> list[dict]:
    return [doc for path in sorted(DEPLOY.glob("*.yaml")) if path.name != "cluster-profile.yaml"
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def of_kind(kind: str) -> list[dict]:
    return [doc for doc in documents() if doc["kind"] == kind]


@pytest.mark.parametrize("doc", [d for d in documents() if d["kind"] not in CUSTOM_KINDS], ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_kubernetes_objects_validate_strictly(doc):
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_wrong_field_is_caught_by_the_same_check():
    bad = {**of_kind("PriorityClass")[0], "value": "high"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_volcano_queues_are_well_formed():
    queues = of_kind("Queue")
    assert {q["metadata"]["name"] for q in queues} == {"research", "production"}
    for queue in queues:
        assert queue["apiVersion"] == "scheduling.volcano.sh/v1beta1" and DNS1035_LABEL.fullmatch(queue["metadata"]["name"])
        assert set(queue["spec"]) <= QUEUE_FIELDS, queue["spec"]
        assert isinstance(queue["spec"]["weight"], int) and queue["spec"]["weight"] >= 1
        assert isinstance(queue["spec"]["reclaimable"], bool)
        assert all(parse_quantity(value) is not None for value in queue["spec"]["capability"].values())


def test_the_profile_names_the_queues_and_priorities_deployed():
    profile = load_profile(DEPLOY / "cluster-profile.yaml")
    assert profile.launcher == "volcano"
    assert set(profile.queues) == {q["metadata"]["name"] for q in of_kind("Queue")}
    priorities = {p["metadata"]["name"] for p in of_kind("PriorityClass")}
    assert all(set(queue.priorities) <= priorities for queue in profile.queues.values())
    gpus = {q["metadata"]["name"]: int(q["spec"]["capability"]["nvidia.com/gpu"]) for q in of_kind("Queue")}
    assert all(queue.nodes * queue.gpus_per_node <= gpus[name] for name, queue in profile.queues.items())


def test_the_launcher_may_do_what_it_needs_in_its_namespace_and_no_more():
    [role], [binding], [account] = of_kind("Role"), of_kind("RoleBinding"), of_kind("ServiceAccount")
    grants = {(group, resource): set(rule["verbs"]) for rule in role["rules"] for group in rule["apiGroups"] for resource in rule["resources"]}
    assert grants[("batch.volcano.sh", "jobs")] == {"create", "get", "list", "watch", "delete"}
    assert grants[("", "pods/log")] == {"get"} and "delete" not in grants[("", "pods")]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "model-factory"}]
    assert not of_kind("ClusterRole") and not of_kind("ClusterRoleBinding")


def test_a_job_for_the_deployed_queue_and_priority_validates():
    manifest = job_manifest(JobSpec(experiment="nightly", stage="pretrain", fingerprint="ab" * 32,
                                    image="registry.example/factory@sha256:" + "cd" * 32, queue="research", priority="high",
                                    namespace="model-factory", service_account="factory-launcher"))
    assert manifest["spec"]["queue"] == "research" and manifest["metadata"]["namespace"] == "model-factory"


# --- the data stages' Ray cluster (KubeRay) ---------------------------------------------------------------------------

def ray_cluster_problems(cluster: dict, profile_address: str | None, queues: set[str], image: str, ray_pin: str) -> list[str]:
    """What is wrong with the RayCluster: its shape (KubeRay's v1 fields), its pods (strictly, as Pods), its gang (Volcano,
    a deployed queue, every worker at once), its image and Ray version (the factory's), its head (the profile's address)."""
    found = []
    if (cluster.get("apiVersion"), cluster.get("kind")) != ("ray.io/v1", "RayCluster"):
        found.append(f"{cluster.get('apiVersion')}/{cluster.get('kind')} is not ray.io/v1 RayCluster")
    spec, labels = cluster.get("spec", {}), cluster["metadata"].get("labels", {})
    if labels.get("ray.io/scheduler-name") != "volcano" or labels.get("volcano.sh/queue-name") not in queues:
        found.append(f"not gang-scheduled by Volcano in a deployed queue ({sorted(queues)}): labels {labels}")
    if spec.get("rayVersion") != ray_pin:
        found.append(f"rayVersion {spec.get('rayVersion')!r} is not the {ray_pin!r} pyproject.toml's `ray` extra pins")
    groups = [("headGroupSpec", spec.get("headGroupSpec") or {})]
    groups += [(f"workerGroupSpecs[{i}]", group) for i, group in enumerate(spec.get("workerGroupSpecs") or [])]
    if len(groups) < 2:
        found.append("no worker group: the head schedules, workers compute")
    for path, group in groups:
        allowed = RAY_GROUP_FIELDS - ({"groupName", "replicas", "minReplicas", "maxReplicas"} if path == "headGroupSpec" else set())
        found += [f"{path}.{key}: not a field of KubeRay's group" for key in sorted(set(group) - allowed)]
        if not all(isinstance(value, str) for value in (group.get("rayStartParams") or {}).values()):
            found.append(f"{path}.rayStartParams: KubeRay takes strings only")
        if path != "headGroupSpec" and not group.get("minReplicas") == group.get("replicas") == group.get("maxReplicas"):
            found.append(f"{path}: replicas, minReplicas and maxReplicas differ: the gang is every worker, at once")
        template = group.get("template", {})
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ray"}, "spec": template.get("spec")}
        try:
            kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            found.append(f"{path}.template: {e.message}")
            continue
        found += [f"{path}: container {c['name']} runs {c['image']}, not the factory's image {image}"
                  for c in template["spec"]["containers"] if c["image"] != image]
    head = (spec.get("headGroupSpec") or {}).get("template", {}).get("spec", {}).get("containers", [{}])[0]
    served = {f"ray://{cluster['metadata']['name']}-head-svc.{cluster['metadata'].get('namespace')}.svc:{port['containerPort']}"
              for port in head.get("ports", []) if port.get("name") == "client"}
    if profile_address not in served:
        found.append(f"the profile's ray.address {profile_address!r} is not the head's client service ({sorted(served)})")
    return found


def ray_expectations() -> tuple[str | None, set[str], str, str]:
    profile = load_profile(DEPLOY / "cluster-profile.yaml")
    values = yaml.safe_load((DEPLOY / "helm" / "dagster-values.yaml").read_text())
    image = values["dagster-user-deployments"]["deployments"][0]["image"]
    extras = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    [pin] = [dep.split("==", 1)[1] for dep in extras["ray"] if dep.startswith("ray[")]
    return (profile.ray.address if profile.ray else None), {q["metadata"]["name"] for q in of_kind("Queue")}, \
        f"{image['repository']}:{image['tag']}", pin


def test_the_ray_cluster_runs_the_factorys_image_as_a_volcano_gang_at_the_profiles_address():
    [cluster] = of_kind("RayCluster")
    assert ray_cluster_problems(cluster, *ray_expectations()) == []


@pytest.mark.parametrize("mutate", [
    lambda c: c["metadata"]["labels"].pop("ray.io/scheduler-name"),
    lambda c: c["metadata"]["labels"].update({"volcano.sh/queue-name": "nightly"}),
    lambda c: c["spec"].update(rayVersion="2.60.0"),
    lambda c: c["spec"]["workerGroupSpecs"][0].update(minReplicas=1),
    lambda c: c["spec"]["workerGroupSpecs"][0].update(replica=4),
    lambda c: c["spec"]["headGroupSpec"]["rayStartParams"].update({"num-cpus": 0}),
    lambda c: c["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0].update(volumeMount=[]),
    lambda c: c["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0].update(image="rayproject/ray:2.59.0"),
    lambda c: c["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"][1].update(containerPort=10002),
    lambda c: c["metadata"].update(name="data"),
    lambda c: c["spec"].pop("workerGroupSpecs"),
], ids=["no-volcano", "unknown-queue", "ray-drift", "partial-gang", "misspelt-group-field", "number-param", "bad-pod-field",
        "other-image", "other-port", "other-service", "no-workers"])
def test_a_ray_cluster_that_drifts_is_found(mutate):
    [cluster] = of_kind("RayCluster")
    cluster = copy.deepcopy(cluster)
    mutate(cluster)
    assert ray_cluster_problems(cluster, *ray_expectations())
