"""The Volcano launcher's pure half: every stage an experiment runs as a validated Volcano Job manifest.

`factory run X.md --launcher volcano --dry-run` prints them. Submitting, watching and deleting the Jobs
(a Dagster Pipes client) builds on `job_manifest`; the launcher also creates the ConfigMap
`request_config_map(name)` holding the stage's request, which every pod mounts at REQUEST_PATH.

Placement is `factory.config.stages.placement` (the local launcher's too); each pod asks for
CPU_PER_PROCESS cores and MEMORY_GI_PER_PROCESS GiB of memory per rank it runs. Every stage goes
to the experiment's queue, at its priority.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from factory.config import Experiment, StageSpec, plan_stage, upstream_of
from factory.config.stages import placement
from factory.errors import ConfigError
from factory.launch.volcano_manifest import REQUEST_PATH, JobSpec, build_job, image_problem, job_name, label_value, request_config_map
from factory.launch.volcano_rules import KUBERNETES_VERSION, RULES, validate
from factory.stages.plan import PENDING

CPU_PER_PROCESS = 2
MEMORY_GI_PER_PROCESS = 8

__all__ = [
    "KUBERNETES_VERSION", "REQUEST_PATH", "RULES", "JobSpec", "build_job", "dry_run", "job_manifest", "job_name", "job_spec",
    "label_value", "plan_jobs", "render", "request_config_map", "validate",
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


def plan_jobs(experiments: Iterable[Experiment]) -> list[JobSpec]:
    """One JobSpec per stage to compute, in run order; a stage that several variants share (same fingerprint) once.

    Upstream artifacts that do not exist yet stand in as `pending:<fingerprint>`, as in `factory plan`.
    """
    jobs: list[JobSpec] = []
    seen: set[str] = set()
    for experiment in experiments:
        if problem := image_problem(experiment.image):
            raise ConfigError(f"{experiment.source or experiment.name}: image: {problem}")
        digests: dict[str, str] = {}
        for kind in experiment.stages():
            stage = plan_stage(experiment, kind, {name: digests[name] for name in upstream_of(experiment, kind)})
            digests[kind] = PENDING + stage.fingerprint
            if stage.fingerprint not in seen:
                seen.add(stage.fingerprint)
                jobs.append(job_spec(experiment, stage))
    return jobs


def render(manifests: Iterable[Mapping[str, Any]]) -> str:
    """Manifests as YAML documents separated by `---`, keys in the order they were built, no anchors."""
    return yaml.dump_all([dict(m) for m in manifests], Dumper=_PlainDumper, sort_keys=False, default_flow_style=False)


def dry_run(experiments: Iterable[Experiment]) -> str:
    """Every Job that running these experiments would submit, validated, as YAML."""
    return render(job_manifest(spec) for spec in plan_jobs(experiments))


class _PlainDumper(yaml.SafeDumper):
    """Writes a repeated object out again instead of as an anchor and alias (kubectl reads both, people read this)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
