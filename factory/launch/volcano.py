"""The Volcano launcher's pure half: every stage an experiment runs as a validated Volcano Job manifest.

`factory run X.md --launcher volcano --dry-run` and `factory plan X.md --launcher volcano` print them.
Submitting, watching and deleting a Job is `volcano_client.VolcanoJobs` (the Dagster resource
`resources.VolcanoStageLauncher` drives it through Pipes); it also creates the ConfigMap
`request_config_map(name)` holding the stage's request, which every pod mounts at REQUEST_PATH.

Placement is `factory.config.stages.placement` (the local launcher's too); each pod asks for
CPU_PER_PROCESS cores and MEMORY_GI_PER_PROCESS GiB of memory per rank it runs. Every stage goes
to the experiment's queue, at its priority; an evaluation batch, which belongs to no one experiment,
goes where the profile's `kubernetes.evaluations` says, in the code location's image.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import yaml

from factory.config import Experiment, StageSpec, plan_stage, upstream_of
from factory.config.cluster import KubernetesSettings
from factory.config.stages import placement
from factory.config.stages import PENDING, stages_of
from factory.errors import ConfigError
from factory.launch.volcano_manifest import REQUEST_PATH, JobSpec, build_job, image_problem, job_name, label_value, request_config_map
from factory.launch.volcano_rules import KUBERNETES_VERSION, RULES, validate
from factory.registry.seam import Registry

CPU_PER_PROCESS = 2
MEMORY_GI_PER_PROCESS = 8

__all__ = [
    "KUBERNETES_VERSION", "REQUEST_PATH", "RULES", "JobSpec", "batch_job_spec", "build_job", "cluster_job_spec", "dry_run", "job_manifest", "job_name",
    "job_spec", "label_value", "plan_jobs", "render", "request_config_map", "validate", "with_registry",
]


def job_manifest(spec: JobSpec) -> dict[str, Any]:
    """The Volcano Job of one stage, validated: ConfigError names each field the cluster would refuse."""
    manifest = build_job(spec)
    validate(manifest)
    return manifest


def job_spec(experiment: Experiment, stage: StageSpec) -> JobSpec:
    """Where one stage of `experiment` runs on the cluster (see the module docstring for the defaults)."""
    where = placement(experiment, stage.kind)
    return JobSpec(
        experiment=experiment.name, stage=stage.kind, fingerprint=stage.fingerprint, image=experiment.image,
        nodes=where.nodes, processes_per_node=where.processes, gpus=where.gpus,
        cpu=str(CPU_PER_PROCESS * where.processes), memory=f"{MEMORY_GI_PER_PROCESS * where.processes}Gi",
        queue=experiment.resources.queue, priority=experiment.resources.priority,
    )


def cluster_job_spec(experiment: Experiment, stage: StageSpec, settings: KubernetesSettings | None, env: Mapping[str, str] = {}) -> JobSpec:
    """`job_spec` placed on one cluster: its namespace, service account, registry, shared storage and Secrets, plus `env`."""
    spec = job_spec(experiment, stage)
    return _on_cluster(spec, settings, env) if settings is not None else replace(spec, env=dict(env))


def _on_cluster(spec: JobSpec, settings: KubernetesSettings, env: Mapping[str, str]) -> JobSpec:
    return replace(
        spec, env={**(settings.store.environ() if settings.store else {}), **env},
        image=with_registry(spec.image, settings.image_registry), namespace=settings.namespace,
        service_account=settings.service_account, env_secrets={name: (ref.secret, ref.key) for name, ref in settings.env_secrets.items()},
        storage=(settings.storage.claim, settings.storage.mount_path) if settings.storage else None, max_retry=settings.max_retry,
    )


def batch_job_spec(stage: StageSpec, settings: KubernetesSettings, image: str | None, env: Mapping[str, str] = {}) -> JobSpec:
    """The Job of a stage of no one experiment (an evaluation batch), placed as the profile's `kubernetes.evaluations`
    says, in `image` when that names none (the image of the Dagster run launching it)."""
    where = settings.evaluations
    image = where.image or image
    if not image:
        raise ConfigError(f"{stage.kind}: no image to run it in: set kubernetes.evaluations.image in the cluster profile (the code "
                          "location's image, pinned by digest), or run the code location from Dagster's Helm chart, which sets "
                          "$DAGSTER_CURRENT_IMAGE")
    if problem := image_problem(image):
        raise ConfigError(f"{stage.kind}: image {image!r}: {problem}; set kubernetes.evaluations.image in the cluster profile")
    spec = JobSpec(
        experiment="evaluations", stage=stage.kind, fingerprint=stage.fingerprint, image=image, gpus=where.gpus,
        cpu=str(CPU_PER_PROCESS), memory=f"{MEMORY_GI_PER_PROCESS}Gi", queue=where.queue or "default", priority=where.priority,
    )
    return _on_cluster(spec, settings, env)


def with_registry(image: str, registry: str | None) -> str:
    """`image` pulled from `registry` when it names no registry of its own (its first path part has no '.' or ':')."""
    first = image.split("/", 1)[0]
    if not registry or ("/" in image and ("." in first or ":" in first or first == "localhost")):
        return image
    return f"{registry.rstrip('/')}/{image}"


def plan_jobs(
    experiments: Iterable[Experiment], settings: KubernetesSettings | None = None, registry: Registry | None = None
) -> list[JobSpec]:
    """One JobSpec per stage to compute, in run order; a stage that several variants share (same fingerprint) once.

    With a `registry`, stages it already holds are cached (no Job) and their artifacts are the upstream of the others;
    upstream artifacts that do not exist yet stand in as `pending:<fingerprint>`, as in `factory plan`.
    """
    jobs: list[JobSpec] = []
    seen: set[str] = set()
    for experiment in experiments:
        if problem := image_problem(experiment.image):
            raise ConfigError(f"{experiment.source or experiment.name}: image: {problem}")
        digests: dict[str, str] = {}
        for kind in stages_of(experiment):
            stage = plan_stage(experiment, kind, {name: digests[name] for name in upstream_of(experiment, kind)})
            cached = registry.lookup(stage.fingerprint) if registry is not None else None
            digests[kind] = cached.digest if cached is not None else PENDING + stage.fingerprint
            if cached is not None:
                continue
            if stage.fingerprint not in seen:
                seen.add(stage.fingerprint)
                jobs.append(cluster_job_spec(experiment, stage, settings))
    return jobs


def render(manifests: Iterable[Mapping[str, Any]]) -> str:
    """Manifests as YAML documents separated by `---`, keys in the order they were built, no anchors."""
    return yaml.dump_all([dict(m) for m in manifests], Dumper=_PlainDumper, sort_keys=False, default_flow_style=False)


def dry_run(experiments: Iterable[Experiment], settings: KubernetesSettings | None = None, registry: Registry | None = None) -> str:
    """Every Job that running these experiments would submit (on the cluster `settings` describes; stages `registry`
    holds are cached), validated, as YAML."""
    return render(job_manifest(spec) for spec in plan_jobs(experiments, settings, registry))


class _PlainDumper(yaml.SafeDumper):
    """Writes a repeated object out again instead of as an anchor and alias (kubectl reads both, people read this)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
