"""The Volcano Job of one stage: a pure builder from a typed `JobSpec` to the manifest (a plain dict).

A stage is one Volcano Job: a `master` task (one pod) and a `worker` task (nodes - 1 pods), gang-scheduled
(`minAvailable` = every pod). Volcano's pytorch plugin gives each pod WORLD_SIZE (the number of pods), RANK
(the pod's rank), MASTER_ADDR and MASTER_PORT; its svc plugin makes the headless Service that MASTER_ADDR
resolves through. torchrun reads none of those by itself, so the container command hands them over
(`torchrun_command`). The stage reads its request from a ConfigMap that the launcher creates next to the
Job (`request_config_map`), mounted read-only at REQUEST_DIR.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from factory.config.schema import IMAGE_PATTERN
from factory.errors import ConfigError
from factory.launch.local import PROGRESS_ENV, STAGE_MODULE

API_VERSION = "batch.volcano.sh/v1alpha1"
KIND = "Job"
SCHEDULER = "volcano"
MASTER, WORKER = "master", "worker"
"""Task names; the pytorch plugin is told them, and gives rank 0 to the master's pod."""
MASTER_PORT = 23456
PLUGINS: dict[str, list[str]] = {"pytorch": [f"--master={MASTER}", f"--worker={WORKER}", f"--port={MASTER_PORT}"], "svc": [], "env": []}
JOB_POLICIES = (
    {"event": "PodEvicted", "action": "RestartJob"},
    {"event": "PodFailed", "action": "RestartJob"},
)
"""A lost or failed pod restarts the whole gang (up to `maxRetry` times): ranks cannot rejoin a running torchrun."""
MASTER_POLICIES = ({"event": "TaskCompleted", "action": "CompleteJob"},)
"""The job is done when the master's pod is: rank 0 publishes the artifact."""
CONTAINER = "stage"
REQUEST_DIR = "/var/run/factory"
REQUEST_FILE = "request.json"
REQUEST_PATH = f"{REQUEST_DIR}/{REQUEST_FILE}"
RUN_AS = 1000
"""The non-root user and group the stage runs as."""
GPU_RESOURCE = "nvidia.com/gpu"
LABEL_PREFIX = "model-factory/"
JOB_NAME_MAX = 50
"""Pods are named `<job>-worker-<index>` and that name is their hostname (a DNS label of at most 63)."""
LABEL_MAX = 63
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
SECRET_NAME = re.compile(r"(^|_)(TOKEN|KEY|PASSWORD|PASSWD|SECRET|CREDENTIALS?)$", re.IGNORECASE)
"""Env names whose value is a credential: they may only come from a Secret (`valueFrom.secretKeyRef`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobSpec:
    """Everything one stage's Volcano Job is built from; plain values, so the launcher knows nothing of training."""

    experiment: str
    """The experiment (or sweep variant) name: in the Job's name, labels and annotations."""
    stage: str
    """The stage kind (pretrain, tokenizer, ...)."""
    fingerprint: str
    """The stage's fingerprint (hex): its first 8 characters end the Job name, so a resubmission finds the same Job."""
    image: str
    """The training image, pinned by digest: `name@sha256:<64 hex>`."""
    stage_args: tuple[str, ...] = ("-m", STAGE_MODULE, REQUEST_PATH)
    """What torchrun runs in each rank."""
    nodes: int = 1
    """Pods: one master, nodes - 1 workers."""
    processes_per_node: int = 1
    """Ranks torchrun starts in each pod."""
    gpus: int = 0
    """GPUs per pod (`nvidia.com/gpu`), requested and limited alike."""
    cpu: str = "2"
    """CPU per pod, requested and limited alike (a Kubernetes quantity)."""
    memory: str = "8Gi"
    """Memory per pod, requested and limited alike (a Kubernetes quantity); /dev/shm counts against it."""
    shm_size: str = "2Gi"
    """Size of the memory-backed /dev/shm (torch's data loader workers and NCCL use it)."""
    queue: str = "default"
    """Volcano queue."""
    priority: str | None = None
    """PriorityClass name; None: the cluster's default."""
    max_retry: int = 3
    """How many times a failed or evicted gang is restarted before the Job fails."""
    ttl_seconds_after_finished: int = 3600
    """Volcano deletes a finished Job after this long (a backstop: the launcher deletes it as soon as it is done)."""
    namespace: str | None = None
    """None: left out of the manifest (the namespace of whoever submits it)."""
    service_account: str | None = None
    """None: the namespace's default. The API token is never mounted: a stage does not talk to Kubernetes."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Plain environment variables; names that look like credentials are refused (use `env_secrets`)."""
    env_secrets: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """Environment variable -> (Secret name, key): credentials, only ever as references."""
    storage: tuple[str, str] | None = None
    """(PersistentVolumeClaim, mount path): the shared volume the registry and the warehouse live on."""

    def __post_init__(self) -> None:
        if problem := image_problem(self.image):
            raise ConfigError(f"image: {problem}")
        if not re.fullmatch(r"[0-9a-f]{8,}", self.fingerprint):
            raise ConfigError(f"fingerprint {self.fingerprint!r} is not a stage fingerprint (hex)")
        if self.nodes < 1 or self.processes_per_node < 1 or self.gpus < 0:
            raise ConfigError(f"placement: nodes ({self.nodes}) and processes_per_node ({self.processes_per_node}) must be at least 1, "
                              f"gpus ({self.gpus}) at least 0")
        if leaked := sorted(name for name in self.env if SECRET_NAME.search(name)):
            raise ConfigError(f"env: {', '.join(leaked)} look like credentials: pass them as env_secrets (a Kubernetes Secret and "
                              "key), never as plain values")


def image_problem(image: str) -> str | None:
    """Why `image` cannot run on a cluster, or None when it is pinned by digest."""
    if image == "local":
        return ("'local' runs only with the local launcher (the source tree on this machine); pin the training image by digest, "
                "image: name@sha256:<64 hex>, to run on Volcano")
    if not IMAGE_PATTERN.fullmatch(image):
        return f"{image!r} is not pinned by digest: use name@sha256:<64 hex>, so every pod runs the same code"
    return None


def label_value(text: str) -> str:
    """`text` as a valid label value: other characters become '-', cut to 63, trimmed to start and end alphanumeric."""
    value = re.sub(r"[^A-Za-z0-9._-]", "-", text)[:LABEL_MAX]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def job_name(experiment: str, stage: str, fingerprint: str) -> str:
    """A deterministic DNS-1035 label of at most JOB_NAME_MAX: experiment and stage (cut to fit), then 8 of the fingerprint.

    DNS-1035 (a letter first) rather than a DNS-1123 subdomain: the svc plugin names a Service after the Job.
    """
    suffix = "-" + fingerprint[:8].lower()
    base = re.sub(r"[^a-z0-9]+", "-", f"{experiment}-{stage}".lower()).strip("-")
    if not base[:1].isalpha():
        base = f"f-{base}"
    return base[: JOB_NAME_MAX - len(suffix)].rstrip("-") + suffix


def request_config_map(name: str) -> str:
    """The ConfigMap the launcher creates, before the Job, holding the stage's request as REQUEST_FILE."""
    return f"{name}-request"


def torchrun_command(processes_per_node: int, stage_args: Sequence[str]) -> list[str]:
    """torchrun told its place in the gang by the pytorch plugin's env: `$(VAR)`, which Kubernetes expands.

    Kubernetes replaces `$(VAR)` in a container's command with the container's env when it starts it: no shell in
    the image, no quoting. It sees every env entry, whereas an entry such as PET_NNODES=$(WORLD_SIZE) would see only
    the entries before it, and the plugin appends its own last. A `$` of the stage's own arguments is doubled, which
    Kubernetes turns back into one `$` without expanding it.
    """
    return [
        "torchrun", "--nnodes=$(WORLD_SIZE)", "--node_rank=$(RANK)", f"--nproc_per_node={processes_per_node}",
        "--master_addr=$(MASTER_ADDR)", "--master_port=$(MASTER_PORT)", *(arg.replace("$", "$$") for arg in stage_args),
    ]


def build_job(spec: JobSpec) -> dict[str, Any]:
    """The Volcano Job manifest of one stage (not validated: see `volcano_rules.validate`)."""
    name = job_name(spec.experiment, spec.stage, spec.fingerprint)
    tasks = [_task(spec, name, MASTER, 1, MASTER_POLICIES)]
    if spec.nodes > 1:
        tasks.append(_task(spec, name, WORKER, spec.nodes - 1, ()))
    metadata: dict[str, Any] = {"name": name}
    if spec.namespace:
        metadata["namespace"] = spec.namespace
    metadata["labels"] = _labels(spec)
    metadata["annotations"] = {LABEL_PREFIX + key: value for key, value in
                               (("experiment", spec.experiment), ("stage", spec.stage), ("fingerprint", spec.fingerprint),
                                ("image", spec.image))}
    job: dict[str, Any] = {"schedulerName": SCHEDULER, "queue": spec.queue}
    if spec.priority:
        job["priorityClassName"] = spec.priority
    job |= {
        "minAvailable": sum(task["replicas"] for task in tasks),
        "maxRetry": spec.max_retry,
        "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
        "plugins": {plugin: list(args) for plugin, args in PLUGINS.items()},
        "policies": [dict(policy) for policy in JOB_POLICIES],
        "tasks": tasks,
    }
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": job}


def _labels(spec: JobSpec) -> dict[str, str]:
    """Sanitised for selection; the annotations keep the full values."""
    return {LABEL_PREFIX + "experiment": label_value(spec.experiment), LABEL_PREFIX + "stage": label_value(spec.stage),
            LABEL_PREFIX + "fingerprint": label_value(spec.fingerprint)}


def _task(spec: JobSpec, name: str, task: str, replicas: int, policies: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    resources = {"cpu": spec.cpu, "memory": spec.memory, **({GPU_RESOURCE: str(spec.gpus)} if spec.gpus else {})}
    container = {
        "name": CONTAINER,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": torchrun_command(spec.processes_per_node, spec.stage_args),
        "env": _env(spec),
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "request", "mountPath": REQUEST_DIR, "readOnly": True}],
    }
    pod: dict[str, Any] = {
        # Never: a failed pod stays failed, and the job's PodFailed policy restarts the whole gang.
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
            {"name": "request", "configMap": {"name": request_config_map(name), "items": [{"key": REQUEST_FILE, "path": REQUEST_FILE}]}},
        ],
    }
    if spec.storage is not None:
        claim, path = spec.storage
        container["volumeMounts"].append({"name": "store", "mountPath": path})
        pod["volumes"].append({"name": "store", "persistentVolumeClaim": {"claimName": claim}})
    if spec.service_account:
        pod["serviceAccountName"] = spec.service_account
    result: dict[str, Any] = {"name": task, "replicas": replicas}
    if policies:
        result["policies"] = [dict(policy) for policy in policies]
    result["template"] = {"metadata": {"labels": _labels(spec)}, "spec": pod}
    return result


def _env(spec: JobSpec) -> list[dict[str, Any]]:
    plain = {"PYTHONUNBUFFERED": "1", PROGRESS_ENV: "0", **spec.env}  # logs, not a progress bar: nobody watches a pod's terminal
    secrets = [{"name": env, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}} for env, (secret, key) in spec.env_secrets.items()]
    return [{"name": env, "value": value} for env, value in plain.items()] + secrets
