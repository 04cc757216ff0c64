"""A cluster profile: which launcher runs stages and what each queue can hold, for `factory check --cluster`.

A profile is YAML, kept with the deployment rather than with any experiment:

    launcher: volcano
    queues:
      default: {nodes: 4, gpus_per_node: 8, priorities: [normal, high]}
      cpu: {nodes: 16, gpus_per_node: 0}
    kubernetes:
      namespace: model-factory
      kubeconfig: ~/.kube/config
      image_registry: registry.example.com/ml
      storage: {claim: factory-store, mount_path: /store}     # or, for artifacts and tables, an object store:
      store: {uri: "s3://team-bucket/factory", endpoint: "https://s3.example.com", region: eu-west-1}
      env_secrets: {AWS_ACCESS_KEY_ID: {secret: factory-s3, key: access-key-id},
                    AWS_SECRET_ACCESS_KEY: {secret: factory-s3, key: secret-access-key}}
      evaluations: {queue: cpu, image: registry.example.com/ml/model-factory@sha256:...}
    pools: {training: 4, evaluation: 8}
    ray: {address: "ray://factory-data-head-svc.model-factory.svc:10001"}   # the data stages' Ray cluster

With one, `factory check` refuses placements that cannot be scheduled (an unknown queue, more
nodes or GPUs than the queue has, an unknown priority class) and `image: local`, which only the
local launcher can run, before anything is submitted. Its `pools` say how many training stages and
evaluations the Dagster instance that uses it runs at once (`python -m assets.pools` applies them). Its `ray`
names the Ray cluster the data stages' engine runs on (deploy/ray-cluster.yaml); without it, they run on this
machine's cores.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator

from factory.config.files import read_text
from factory.config.front_matter import parse_yaml
from factory.config.loader import describe_validation_error
from factory.config.section import Section
from factory.config.pools import POOL_LIMITS
from factory.errors import ConfigError

RAY_ADDRESS_ENV = "FACTORY_RAY_ADDRESS"
"""The Ray cluster a data stage's engine connects to (factory/data/engine.py); unset: Daft's native runner."""


class QueueSpec(Section):
    """What one scheduler queue can give a stage."""

    nodes: int = Field(ge=1, le=100_000)
    """Most machines one stage may span."""
    gpus_per_node: int = Field(0, ge=0, le=64)
    """GPUs on each of those machines."""
    priorities: tuple[str, ...] = ()
    """Priority classes stages may ask for (empty: no priority may be asked for)."""


class SecretRef(Section):
    """One key of a Kubernetes Secret: how a credential reaches a pod (never its value)."""

    secret: str = Field(min_length=1)
    key: str = Field(min_length=1)


class StorageSpec(Section):
    """The shared volume every pod mounts: the registry and the Iceberg warehouse live on it, at the same path as in
    the Dagster code location, so the paths in a stage's request mean the same thing in the pod."""

    claim: str = Field(min_length=1)
    """A PersistentVolumeClaim (ReadWriteMany) in the namespace: deploy/store-pvc.yaml."""
    mount_path: str = Field(pattern=r"^/")
    """Where it is mounted in every pod."""


class StoreSpec(Section):
    """The object store the stages' pods read and write artifacts, checkpoints and tables in (`FACTORY_STORE` in each pod,
    with the endpoint and region as the standard AWS variables); its credentials are `env_secrets` (`AWS_ACCESS_KEY_ID`,
    `AWS_SECRET_ACCESS_KEY`), or the pod's own identity when there are none."""

    uri: str = Field(pattern=r"^[a-z][a-z0-9+.-]*://[^/\s]+(/\S*)?$")
    """`s3://bucket/prefix`."""
    endpoint: str | None = Field(None, pattern=r"^https?://\S+$")
    """The S3 endpoint (None: the provider's default for the region)."""
    region: str | None = Field(None, pattern=r"^[a-z0-9-]{1,64}$")

    @field_validator("uri")
    @classmethod
    def _known_scheme(cls, uri: str) -> str:
        from factory.storage import BACKENDS

        scheme = uri.partition("://")[0]
        if scheme == "file" or scheme not in BACKENDS:
            known = ", ".join(f"{name}://" for name in BACKENDS if name != "file")
            raise ValueError(f"{scheme}:// is no object store the factory knows; known: {known}")
        return uri

    def environ(self) -> dict[str, str]:
        """What each pod's environment says of the store (no credential: those are Secret references)."""
        return {"FACTORY_STORE": self.uri, **({"AWS_ENDPOINT_URL": self.endpoint} if self.endpoint else {}),
                **({"AWS_REGION": self.region} if self.region else {})}


class EvaluationPlacement(Section):
    """Where evaluation batches run: a batch scores checkpoints of any experiment with the code location's evaluator, so it
    runs in the code location's image, not in one experiment's."""

    image: str | None = None
    """The image, pinned by digest (None: the image of the Dagster run that launches the batch, `$DAGSTER_CURRENT_IMAGE`,
    which Dagster's Helm chart sets to the code location's)."""
    queue: str | None = None
    """The Volcano queue (one of the profile's `queues`); None: Volcano's own `default` queue."""
    priority: str | None = None
    """The PriorityClass (one of the queue's `priorities`); None: the cluster's default."""
    gpus: int = Field(0, ge=0, le=64)
    """GPUs for the batch's pod (scoring a large model is faster on one)."""


class KubernetesSettings(Section):
    """How the Volcano launcher reaches the cluster and what its pods get."""

    namespace: str = "model-factory"
    """Where stage Jobs run: deploy/namespace-rbac.yaml creates it and lets the launcher work there."""
    kubeconfig: str | None = None
    """A kubeconfig file (None: $KUBECONFIG or ~/.kube/config); ignored with in_cluster."""
    context: str | None = None
    """The kubeconfig context (None: its current one)."""
    in_cluster: bool = False
    """Use the service account of the pod the launcher runs in (a Dagster run pod)."""
    image_registry: str | None = None
    """Prefixed to an experiment's image that names no registry (`trainer@sha256:...` -> `<registry>/trainer@sha256:...`)."""
    service_account: str = "factory-launcher"
    """The pods' service account (its API token is never mounted)."""
    storage: StorageSpec | None = None
    """The shared volume (None: the pods share storage some other way: an object store, `store`, or the node's disk on a
    one-node cluster)."""
    store: StoreSpec | None = None
    """The object store artifacts, checkpoints and tables live in; with it, `storage` is not needed for them."""
    env_secrets: dict[str, SecretRef] = {}
    """Credentials the stages need (e.g. a tracker token), as Secret references."""
    max_retry: int = Field(3, ge=0, le=1000)
    """How many times a gang that lost a pod (evicted, failed) is restarted before the stage fails."""
    schedule_timeout_s: float | None = Field(3600.0, gt=0, le=30 * 86_400)
    """A stage not scheduled for this long fails with the scheduler's reason (None: wait for ever)."""
    poll_s: float = Field(2.0, gt=0, le=3600)
    """How often the launcher reads the Job's state."""
    evaluations: EvaluationPlacement = EvaluationPlacement()
    """Where evaluation batches run (each a Volcano Job, as every stage)."""


class RaySettings(Section):
    """The Ray cluster the data stages run on (Daft's Ray runner): `FACTORY_RAY_ADDRESS` in each stage's environment."""

    address: str = Field(pattern=r"^(ray://)?[A-Za-z0-9.-]+:[0-9]{1,5}$")
    """`ray://<head>:10001` (Ray Client, from anywhere) or `<head>:6379` (the head's GCS, from a machine of the cluster)."""

    def environ(self) -> dict[str, str]:
        """What a stage's environment says of the cluster."""
        return {RAY_ADDRESS_ENV: self.address}


class ClusterProfile(Section):
    """Where stages run and what they may ask for."""

    launcher: Literal["local", "volcano"] = "local"
    """`local`: processes on this machine; `volcano`: Volcano Jobs on Kubernetes (the image must be pinned)."""
    queues: dict[str, QueueSpec] = Field(min_length=1)
    """Queues by name."""
    kubernetes: KubernetesSettings | None = None
    """The cluster the volcano launcher submits to (needed to run; `factory check --cluster` reads only the queues)."""
    pools: dict[str, Annotated[int, Field(ge=0, le=10_000)]] = {}
    """Slots per concurrency pool (`training`, `evaluation`): how many of its stages run at once; a pool left out
    keeps the instance's limit."""
    ray: RaySettings | None = None
    """The Ray cluster the data stages' engine runs on (None: Daft's native runner, on every core of the machine a
    stage runs on)."""

    @field_validator("pools")
    @classmethod
    def _known_pools(cls, pools: dict[str, int]) -> dict[str, int]:
        if unknown := sorted(set(pools) - set(POOL_LIMITS)):
            raise ValueError(f"unknown pool {', '.join(unknown)}; pools are: {', '.join(POOL_LIMITS)}")
        return pools


def load_profile(path: Path) -> ClusterProfile:
    """Read a cluster profile; errors name file:line and the field."""
    try:
        text = read_text(path)  # bounded: a regular file of at most MAX_FILE_BYTES, never a FIFO or a device
    except ConfigError as e:
        raise ConfigError(f"cannot read the cluster profile: {e}") from e
    raw, lines = parse_yaml(path, text, 1)
    try:
        profile = ClusterProfile.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(path, e, {key: (path, line) for key, line in lines.items()}, ClusterProfile)) from e
    evaluations = profile.kubernetes.evaluations if profile.kubernetes else None
    if evaluations and evaluations.queue and (found := queue_problems(profile, evaluations.queue, 1, evaluations.gpus, evaluations.priority)):
        where, message = found[0]
        field = ("kubernetes", "evaluations", where)
        line = lines.get(field) or lines.get(field[:2]) or lines.get(field[:1]) or 1
        raise ConfigError(f"{path}:{line}: {'.'.join(field)}: {message}")
    return profile


def ray_unreachable(address: str, timeout_s: float = 5.0) -> str | None:
    """Why nothing answers at a Ray address (a TCP connection to its head), or None when something does: Ray's own
    client waits minutes for a head that is not there."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return None
    except OSError as e:
        return e.strerror or type(e).__name__


def check_ray(path: Path, profile: ClusterProfile) -> None:
    """ConfigError at the profile's `ray.address` (file:line) unless its Ray cluster answers: checked before a run starts
    any stage."""
    if profile.ray is None or (reason := ray_unreachable(profile.ray.address)) is None:
        return
    _, lines = parse_yaml(path, read_text(path), 1)
    line = lines.get(("ray", "address")) or lines.get(("ray",)) or 1
    raise ConfigError(f"{path}:{line}: ray.address: no Ray cluster answers at {profile.ray.address} ({reason}); start one "
                      "(`ray start --head`, or deploy/ray-cluster.yaml on Kubernetes) or correct the address")


def queue_problems(profile: ClusterProfile, queue: str, nodes: int, gpus: int, priority: str | None) -> list[tuple[str, str]]:
    """What the profile's queue `queue` cannot give a stage of `nodes` x `gpus` at `priority`, as (field, message) pairs:
    the field is `queue`, `nodes`, `gpus` or `priority`."""
    offered = profile.queues.get(queue)
    if offered is None:
        return [("queue", f"unknown queue {queue!r}; the cluster has: {', '.join(sorted(profile.queues))}")]
    found = []
    if nodes > offered.nodes:
        found.append(("nodes", f"{nodes} nodes, but queue {queue!r} gives a stage at most {offered.nodes}"))
    if gpus > offered.gpus_per_node:
        found.append(("gpus", f"{gpus} GPUs per node, but queue {queue!r} has {offered.gpus_per_node}"))
    if priority is not None and priority not in offered.priorities:
        found.append(("priority", f"priority {priority!r} is not offered by queue {queue!r}; offered: {', '.join(offered.priorities) or 'none'}"))
    return found
