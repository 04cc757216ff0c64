"""deploy/: every Kubernetes object validates against the real schemas, the Volcano queues are well formed, and the
files agree with each other and with the cluster profile `factory check --cluster` reads."""

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


def documents() -> list[dict]:
    return [doc for path in sorted(DEPLOY.glob("*.yaml")) if path.name != "cluster-profile.yaml"
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def of_kind(kind: str) -> list[dict]:
    return [doc for doc in documents() if doc["kind"] == kind]


@pytest.mark.parametrize("doc", [d for d in documents() if d["kind"] != "Queue"], ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
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
