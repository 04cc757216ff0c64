"""Validation of a Volcano Job before it is submitted: what the cluster would refuse is refused here first.

Three stages, each run only when the one before passed (later ones rely on the shapes the earlier ones checked):
1. shape: the Job's own fields have the types Volcano's CRD gives them (no Volcano schema ships with Python);
2. each task's pod template, wrapped into a Pod, against the Kubernetes schema (kubernetes-validate, strict:
   unknown fields are errors) of KUBERNETES_VERSION;
3. RULES: what Volcano's admission webhook checks (pkg/webhooks/admission/jobs/validate in volcano-sh/volcano:
   admit_job.go and util.go), what Kubernetes' pod validation checks beyond the schema, and the factory's own
   rules (pinned image, credentials only from Secrets, the pytorch plugin wired to the tasks).
Every problem names the field's path in the manifest.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import kubernetes_validate

from factory.errors import ConfigError
from factory.launch.volcano_manifest import (
    API_VERSION, DNS1035_LABEL, DNS1123_LABEL, KIND, MASTER, SCHEDULER, SECRET_NAME, WORKER, image_problem,
)

KUBERNETES_VERSION = "1.32"
"""The Kubernetes schemas pod templates are checked against (kubernetes-validate ships 1.25 to 1.37)."""
POLICY_EVENTS = ("*", "PodFailed", "PodEvicted", "Unknown", "TaskCompleted", "TaskFailed", "JobUpdated")
"""The events the webhook lets users name (OutOfSync and CommandIssued are internal)."""
POLICY_ACTIONS = ("AbortJob", "RestartJob", "RestartTask", "TerminateJob", "CompleteJob", "ResumeJob")
"""The actions the webhook lets users name (SyncJob, EnqueueJob and the queue actions are internal). Newer
releases add RestartPod and RestartPartition; they are left out so a Job passes older clusters too."""
PLUGINS = ("ssh", "env", "svc", "tensorflow", "mpi", "pytorch")
"""Job plugins every Volcano release since the pytorch plugin (v1.7) registers."""
PYTORCH_ENV = re.compile(r"(?<!\$)\$\((WORLD_SIZE|RANK|MASTER_ADDR|MASTER_PORT)\)")
QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
            "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
STANDARD_RESOURCES = re.compile(r"^(cpu|memory|ephemeral-storage|hugepages-.+)$")
WEBHOOK, KUBERNETES, FACTORY = "volcano webhook", "kubernetes pod validation", "factory"

Problem = tuple[str, str]
"""(field path, what is wrong and what to change)."""

JOB_FIELDS: dict[str, type] = {"schedulerName": str, "queue": str, "priorityClassName": str, "minAvailable": int, "maxRetry": int,
                               "ttlSecondsAfterFinished": int, "plugins": Mapping, "policies": list, "tasks": list}
TASK_FIELDS: dict[str, type] = {"name": str, "replicas": int, "minAvailable": int, "policies": list, "template": Mapping}
POLICY_FIELDS: dict[str, type] = {"event": str, "events": list, "action": str, "exitCode": int}
TYPE_NAMES = {str: "a string", int: "an integer", Mapping: "a mapping", list: "a list"}


@dataclass(frozen=True, slots=True)
class Rule:
    """One check of a shape-valid manifest: yields a Problem for each violation."""

    name: str
    source: str
    """Who would refuse the Job otherwise: WEBHOOK, KUBERNETES, or FACTORY (our own policy)."""
    check: Callable[[Mapping[str, Any]], Iterator[Problem]]


def validate(manifest: Mapping[str, Any]) -> None:
    """Raise ConfigError naming every field the cluster (or the factory) would refuse; return when the Job may be submitted."""
    problems = list(check_shape(manifest))
    problems = problems or list(check_pod_templates(manifest))
    problems = problems or [problem for rule in RULES for problem in rule.check(manifest)]
    if problems:
        metadata = manifest.get("metadata")
        name = metadata.get("name", "?") if isinstance(metadata, Mapping) else "?"
        raise ConfigError(f"Volcano Job {name!r} would be refused:\n" + "\n".join(f"  {path}: {message}" for path, message in problems))


def check_shape(manifest: Mapping[str, Any]) -> Iterator[Problem]:
    """The Job's own fields have Volcano's types; tasks exist and have pod templates."""
    if manifest.get("apiVersion") != API_VERSION or manifest.get("kind") != KIND:
        yield "apiVersion", f"expected apiVersion {API_VERSION!r} and kind {KIND!r}, found {manifest.get('apiVersion')!r}/{manifest.get('kind')!r}"
    metadata = manifest.get("metadata")
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str):
        yield "metadata.name", "a Job needs a name"
    spec = manifest.get("spec")
    if not isinstance(spec, Mapping):
        yield "spec", "a Job needs a spec"
        return
    yield from _typed(spec, "spec", JOB_FIELDS)
    yield from _policy_types(spec, "spec")
    plugins = spec.get("plugins")
    for plugin, args in plugins.items() if isinstance(plugins, Mapping) else ():
        if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
            yield f"spec.plugins.{plugin}", f"expected a list of strings, found {args!r}"
    tasks = spec.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        yield "spec.tasks", "no task specified: a Job needs at least one"
        return
    for index, task in enumerate(tasks):
        path = f"spec.tasks[{index}]"
        if not isinstance(task, Mapping):
            yield path, f"expected a task (mapping), found {task!r}"
            continue
        yield from _typed(task, path, TASK_FIELDS)
        yield from _policy_types(task, path)
        for key in ("name", "template"):
            if key not in task:
                yield f"{path}.{key}", "required"
        if isinstance(task.get("template"), Mapping) and not isinstance(task["template"].get("spec"), Mapping):
            yield f"{path}.template.spec", "a pod template needs a spec"


def check_pod_templates(manifest: Mapping[str, Any]) -> Iterator[Problem]:
    """Each task's pod template, as a Pod, against the Kubernetes schema (strict); the first error of each."""
    for path, task in _tasks(manifest):
        template = task["template"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": template.get("metadata", {}), "spec": template["spec"]}
        try:
            kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in e.path)
            yield f"{path}.template{where}", f"{e.message} (Kubernetes {KUBERNETES_VERSION} schema)"


def _typed(value: Mapping[str, Any], path: str, fields: Mapping[str, type]) -> Iterator[Problem]:
    for key, kind in fields.items():
        found = value.get(key)
        if key in value and (not isinstance(found, kind) or (kind is int and isinstance(found, bool))):
            yield f"{path}.{key}", f"expected {TYPE_NAMES[kind]}, found {found!r}"


def _policy_types(owner: Mapping[str, Any], path: str) -> Iterator[Problem]:
    policies = owner.get("policies")
    for index, policy in enumerate(policies if isinstance(policies, list) else []):
        where = f"{path}.policies[{index}]"
        if not isinstance(policy, Mapping):
            yield where, f"expected a policy (mapping), found {policy!r}"
            continue
        yield from _typed(policy, where, POLICY_FIELDS)
        if isinstance(policy.get("events"), list) and not all(isinstance(event, str) for event in policy["events"]):
            yield f"{where}.events", f"expected a list of event names, found {policy['events']!r}"


def _tasks(manifest: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [(f"spec.tasks[{index}]", task) for index, task in enumerate(manifest["spec"]["tasks"])]


def _containers(manifest: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for path, task in _tasks(manifest):
        yield from _task_containers(path, task)


def _task_containers(path: str, task: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    spec = task["template"]["spec"]
    for group in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(group, [])):
            yield f"{path}.template.spec.{group}[{index}]", container


def _job_counts(manifest: Mapping[str, Any]) -> Iterator[Problem]:
    spec = manifest["spec"]
    total = sum(task.get("replicas", 0) for _, task in _tasks(manifest))
    least = spec.get("minAvailable", 0)
    if least < 0:
        yield "spec.minAvailable", f"must be >= 0, found {least}"
    elif least > total:
        yield "spec.minAvailable", f"{least} is more than the {total} pods of all tasks together: the gang could never start"
    for key in ("maxRetry", "ttlSecondsAfterFinished"):
        if spec.get(key, 0) < 0:
            yield f"spec.{key}", f"must be >= 0, found {spec[key]}"


def _task_counts(manifest: Mapping[str, Any]) -> Iterator[Problem]:
    for path, task in _tasks(manifest):
        replicas = task.get("replicas", 0)
        if replicas < 0:
            yield f"{path}.replicas", f"must be >= 0, found {replicas}"
        if "minAvailable" in task and not 0 <= task["minAvailable"] <= replicas:
            yield f"{path}.minAvailable", f"must be between 0 and the task's replicas ({replicas}), found {task['minAvailable']}"


def _task_names(manifest: Mapping[str, Any]) -> Iterator[Problem]:
    seen: set[str] = set()
    for path, task in _tasks(manifest):
        name = task["name"]
        if not DNS1123_LABEL.fullmatch(name):
            yield f"{path}.name", f"{name!r} is not a DNS-1123 label (lowercase letters, digits and '-', at most 63)"
        elif name in seen:
            yield f"{path}.name", f"duplicate task name {name!r}"
        seen.add(name)


def _policies(manifest: Mapping[str, Any]) -> Iterator[Problem]:
    yield from _policy_list(manifest["spec"].get("policies", []), "spec.policies")
    for path, task in _tasks(manifest):
        yield from _policy_list(task.get("policies", []), f"{path}.policies")


def _policy_list(policies: list[Mapping[str, Any]], path: str) -> Iterator[Problem]:
    """The webhook's validatePolicies: events and actions users may name, each event and exit code handled once."""
    events_seen: set[str] = set()
    codes_seen: set[int] = set()
    for index, policy in enumerate(policies):
        where = f"{path}[{index}]"
        events = {event: f"{where}.events[{i}]" for i, event in reversed(list(enumerate(policy.get("events", []))))}
        if policy.get("event"):
            events[policy["event"]] = f"{where}.event"  # one policy may name an event twice (the webhook dedupes it)
        code = policy.get("exitCode")
        if events and code is not None:
            yield where, "must not set event(s) and exitCode together: one policy reacts to events or to an exit code"
        elif not events and code is None:
            yield where, "needs an event (or events) or an exitCode"
        for event, event_path in events.items():
            if event not in POLICY_EVENTS:
                yield event_path, f"{event!r} is not a policy event Volcano accepts; use one of {', '.join(POLICY_EVENTS)}"
            elif event in events_seen:
                yield event_path, f"duplicate event {event!r}: an earlier policy in {path} already handles it"
            events_seen.add(event)
        if events and policy.get("action") not in POLICY_ACTIONS:
            yield f"{where}.action", f"{policy.get('action')!r} is not a policy action Volcano accepts; use one of {', '.join(POLICY_ACTIONS)}"
        if code is not None and not events:
            if code == 0:
                yield f"{where}.exitCode", "0 is not a valid exit code to react to (it is success)"
            elif code in codes_seen:
                yield f"{where}.exitCode", f"duplicate exitCode {code}"
            codes_seen.add(code)
    if "*" in events_seen and len(events_seen) > 1:
        yield path, f"'*' matches every event: no other event may be named beside it (found {', '.join(sorted(events_seen - {'*'}))})"


def _names(manifest: Mapping[str, Any]) -> Iterator[Problem]:
    name = manifest["metadata"]["name"]
    if not DNS1035_LABEL.fullmatch(name):
        yield "metadata.name", (f"{name!r} is not a DNS-1035 label (a lowercase letter first, then letters, digits and '-', at most 63): "
                                "the svc plugin names a Service after the Job")
        return
    for path, task in _tasks(manifest):
        last_pod = f"{name}-{task['name']}-{max(task.get('replicas', 0) - 1, 0)}"
        if not DNS1123_LABEL.fullmatch(last_pod):
            yield f"{path}.name", f"pod name {last_pod!r} is longer than 63 characters (it is the pod's hostname): shorten the Job name"


def _plugins(manifest: Mapping[str, Any]) -> Iterator[Problem]:
    for plugin in manifest["spec"].get("plugins", {}):
        if plugin not in PLUGINS:
            yield f"spec.plugins.{plugin}", f"unknown job plugin {plugin!r}; Volcano has {', '.join(PLUGINS)}"


def _queue(manifest: Mapping[str, Any]) -> Iterator[Problem]:
    queue = manifest["spec"].get("queue", "default")
    if not DNS1123_LABEL.fullmatch(queue):
        yield "spec.queue", f"{queue!r} is not a queue name (a DNS-1123 label: lowercase letters, digits and '-', at most 63)"


def _scheduler(manifest: Mapping[str, Any]) -> Iterator[Problem]:
    if manifest["spec"].get("schedulerName") != SCHEDULER:
        yield "spec.schedulerName", f"must be {SCHEDULER!r}: only Volcano's scheduler starts the gang together"


def _pytorch_wiring(manifest: Mapping[str, Any]) -> Iterator[Problem]:
    """torchrun's `$(WORLD_SIZE)`... come from the pytorch plugin: it must be there and know every task."""
    plugins = manifest["spec"].get("plugins", {})
    if "pytorch" not in plugins:
        for path, container in _containers(manifest):
            if any(PYTORCH_ENV.search(arg) for arg in [*container.get("command", []), *container.get("args", [])]):
                yield "spec.plugins.pytorch", f"{path} uses $(WORLD_SIZE)/$(RANK)/$(MASTER_ADDR)/$(MASTER_PORT), which only the pytorch plugin sets"
                return
        return
    roles = {MASTER: MASTER, WORKER: WORKER} | dict(arg.lstrip("-").split("=", 1) for arg in plugins["pytorch"] if "=" in arg)
    names = [task["name"] for _, task in _tasks(manifest)]
    if roles[MASTER] not in names:
        yield "spec.tasks", f"the pytorch plugin's master task {roles[MASTER]!r} is missing: no pod would get rank 0 or MASTER_ADDR"
    for path, task in _tasks(manifest):
        if task["name"] not in (roles[MASTER], roles[WORKER]):
            yield f"{path}.name", f"{task['name']!r} is neither the pytorch plugin's master ({roles[MASTER]!r}) nor its worker task: its pods get no RANK"
    if "svc" not in plugins:
        yield "spec.plugins.svc", "the pytorch plugin's MASTER_ADDR resolves through the headless Service of the svc plugin: add svc: []"


def _image(manifest: Mapping[str, Any]) -> Iterator[Problem]:
    for path, container in _containers(manifest):
        if problem := image_problem(container.get("image", "")):
            yield f"{path}.image", problem


def _secrets(manifest: Mapping[str, Any]) -> Iterator[Problem]:
    for path, container in _containers(manifest):
        for index, entry in enumerate(container.get("env", [])):
            if "value" in entry and SECRET_NAME.search(entry["name"]):
                yield (f"{path}.env[{index}].value", f"{entry['name']} looks like a credential: take it from a Kubernetes Secret "
                       "(valueFrom.secretKeyRef), never inline it in the manifest")


def _resources(manifest: Mapping[str, Any]) -> Iterator[Problem]:
    """Quantities parse; requests do not exceed limits; GPUs and other extended resources are whole and requested = limited."""
    for path, container in _containers(manifest):
        resources = container.get("resources", {})
        amounts: dict[str, dict[str, Decimal]] = {"requests": {}, "limits": {}}
        for kind, found in amounts.items():
            for resource, value in resources.get(kind, {}).items():
                parsed = parse_quantity(value)
                if parsed is None:
                    yield f"{path}.resources.{kind}.{resource}", f"{value!r} is not a Kubernetes quantity (e.g. 2, 500m, 8Gi)"
                else:
                    found[resource] = parsed
        for resource, request in amounts["requests"].items():
            limit = amounts["limits"].get(resource)
            where = f"{path}.resources.requests.{resource}"
            if STANDARD_RESOURCES.fullmatch(resource):
                if limit is not None and request > limit:
                    yield where, f"{resources['requests'][resource]!r} is more than the limit {resources['limits'][resource]!r}"
            elif request != request.to_integral_value() or limit != request:
                yield where, f"{resource} is an extended resource: request a whole number and set the same limit"


def _mounts(manifest: Mapping[str, Any]) -> Iterator[Problem]:
    for path, task in _tasks(manifest):
        volumes = {volume["name"] for volume in task["template"]["spec"].get("volumes", [])}
        for where, container in _task_containers(path, task):
            for index, mount in enumerate(container.get("volumeMounts", [])):
                if mount["name"] not in volumes:
                    yield f"{where}.volumeMounts[{index}].name", f"no volume named {mount['name']!r} in the pod template's volumes"


def parse_quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity (`2`, `500m`, `8Gi`, `1e3`) as a number, or None when it is not one."""
    match = QUANTITY.fullmatch(str(value)) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
    if match is None:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        return Decimal(number + suffix) if suffix[:1] in ("e", "E") else Decimal(number) * Decimal(SUFFIXES[suffix])
    except InvalidOperation:
        return None


RULES: tuple[Rule, ...] = (
    Rule("minAvailable within the tasks' pods; maxRetry and ttlSecondsAfterFinished >= 0", WEBHOOK, _job_counts),
    Rule("task replicas >= 0 and task minAvailable within them", WEBHOOK, _task_counts),
    Rule("task names: unique DNS-1123 labels", WEBHOOK, _task_names),
    Rule("lifecycle policies: known events and actions, each once, '*' alone, exitCode alone and not 0", WEBHOOK, _policies),
    Rule("job name a DNS-1035 label, pod names hostnames", WEBHOOK, _names),
    Rule("known job plugins", WEBHOOK, _plugins),
    Rule("queue name a DNS-1123 label", WEBHOOK, _queue),
    Rule("resource quantities, requests within limits, whole extended resources", KUBERNETES, _resources),
    Rule("volume mounts name the pod's volumes", KUBERNETES, _mounts),
    Rule("scheduled by Volcano", FACTORY, _scheduler),
    Rule("pytorch plugin present, with svc, and naming every task", FACTORY, _pytorch_wiring),
    Rule("image pinned by digest", FACTORY, _image),
    Rule("credentials only from Secrets", FACTORY, _secrets),
)
