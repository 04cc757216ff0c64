"""Submit one stage's Volcano Job, watch it to the end, and always delete it: the Kubernetes half of the Volcano launcher.

No Python client for Volcano exists, so Jobs go through the official `kubernetes` client's CustomObjectsApi
(`batch.volcano.sh/v1alpha1`, plural `jobs`); the stage's request goes in a ConfigMap next to it. While the Job
runs, `VolcanoJobs.run`:

- says why it is not running yet (its pods' `PodScheduled` condition: the queue is full, no node fits);
- follows the master pod's log (rank 0 runs there) line by line, again from the start after a restart;
- fails fast on an image that cannot be pulled, and after `schedule_timeout_s` of not being scheduled;
- turns a Failed, Aborted or Terminated Job into StageFailed naming the last pod failure (OOMKilled, Evicted, an
  exit code) and the master's last log lines;
- deletes the Job and its ConfigMap when it ends, however it ends (an exception, a cancelled Dagster run).

The API client is injected: a kubeconfig, in-cluster credentials, or (in tests) a fake API server's address.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import config as kubeconfig_loader
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from factory.errors import LaunchError, StageFailed
from factory.launch.volcano_manifest import API_VERSION, CONTAINER, MASTER, REQUEST_FILE, request_config_map

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "jobs"
JOB_LABEL = "volcano.sh/job-name"
"""The label Volcano puts on every pod of a Job."""
FAILED_PHASES = ("Failed", "Aborted", "Terminated")
IMAGE_ERRORS = ("ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull")
TAIL_LINES = 20


def connect(kubeconfig: str | None = None, in_cluster: bool = False, context: str | None = None) -> k8s.ApiClient:
    """An API client from in-cluster credentials (a pod's service account) or from a kubeconfig (None: the default one)."""
    try:
        if in_cluster:
            kubeconfig_loader.load_incluster_config()
            return k8s.ApiClient()
        configuration = k8s.Configuration()
        path = os.path.expanduser(kubeconfig) if kubeconfig else None
        kubeconfig_loader.load_kube_config(config_file=path, context=context, client_configuration=configuration)
        return k8s.ApiClient(configuration)
    except (ConfigException, OSError) as e:
        where = "in-cluster credentials" if in_cluster else f"kubeconfig {kubeconfig or '(default)'}"
        raise LaunchError(f"cannot connect to Kubernetes with {where}: {e}; set kubernetes.kubeconfig or kubernetes.in_cluster in the "
                          "cluster profile") from e


@dataclass(frozen=True, kw_only=True, slots=True)
class JobState:
    """What one poll saw: the Job's phase, and what its pods say."""

    phase: str
    retries: int = 0
    waiting: str = ""
    """Why pods are not scheduled or not started (empty: nothing to say)."""
    image_error: str = ""
    """An image pull failure, which no retry cures."""
    failure: str = ""
    """The newest pod failure: OOMKilled, Evicted, an exit code."""
    message: str = ""
    """The Job's own reason and message for its phase."""

    def describe(self) -> str:
        """One line for the run's log."""
        said = self.waiting or self.message
        retry = f" (restart {self.retries})" if self.retries else ""
        return f"{self.phase}{retry}" + (f": {said}" if said else "")


class VolcanoJobs:
    """Volcano Jobs of one namespace."""

    def __init__(
        self, api: k8s.ApiClient, namespace: str, log: logging.Logger, *, poll_s: float = 2.0, schedule_timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.custom = k8s.CustomObjectsApi(api)
        self.core = k8s.CoreV1Api(api)
        self.host = api.configuration.host
        self.namespace = namespace
        self.log = log
        self.poll_s = poll_s
        self.schedule_timeout_s = schedule_timeout_s
        self.clock = clock

    def run(self, manifest: Mapping[str, Any], request_json: str, on_line: Callable[[str], str | None]) -> None:
        """Submit the Job with its request, stream the master's log to `on_line`, return when it completed.

        `on_line` returns what the line says to a person (None: nothing, e.g. a Pipes message): the tail quoted on failure.
        Raises StageFailed (the stage or its pods failed) or LaunchError (the cluster refused it); either way, and on
        any interruption, the Job and its ConfigMap are deleted.
        """
        name = manifest["metadata"]["name"]
        tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        follower = _LogFollower(self, name, lambda line: _keep(tail, on_line(line)))

        def last_lines() -> str:
            follower.finish(FAILED_LOG_WAIT_S)  # what the master wrote before it died: the follower may still be reading it
            return _tail(tail)

        try:  # from before the submission: an interrupt may come at any point
            self.submit(manifest, request_json)
            follower.start()
            self._watch(name, manifest, last_lines)
            follower.finish()
        finally:
            follower.stop()
            self.delete(name)

    def submit(self, manifest: Mapping[str, Any], request_json: str) -> None:
        """Create the ConfigMap holding the request, then the Job; a Job of the same name left by an earlier run is replaced."""
        name = manifest["metadata"]["name"]
        config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": request_config_map(name), "labels": {JOB_LABEL: name}},
                      "data": {REQUEST_FILE: request_json}}
        for attempt in range(2):
            try:
                self._call(f"create the request ConfigMap of {name}", self.core.create_namespaced_config_map, self.namespace, config_map)
                self._call(f"create Volcano Job {name}", self.custom.create_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL,
                           dict(manifest))
                self.log.info("submitted Volcano Job %s in namespace %s (queue %s)", name, self.namespace, manifest["spec"]["queue"])
                return
            except _Conflict:
                if attempt:
                    raise LaunchError(f"Volcano Job {name} still exists after it was deleted; delete it by hand: "
                                      f"kubectl -n {self.namespace} delete jobs.batch.volcano.sh {name}") from None
                self.log.warning("Volcano Job %s already exists (left by an earlier run of this stage): deleting it and submitting again", name)
                self.delete(name)
                self._wait_gone(name)

    def delete(self, name: str) -> None:
        """Delete the Job (its pods go with it) and its ConfigMap; what is already gone is fine, and a failure is only logged."""
        calls = ((self.custom.delete_namespaced_custom_object, (GROUP, VERSION, self.namespace, PLURAL, name)),
                 (self.core.delete_namespaced_config_map, (request_config_map(name), self.namespace)))
        for call, args in calls:
            try:
                call(*args, propagation_policy="Background")
            except ApiException as e:
                if e.status != 404:
                    self.log.error("could not delete %s of Volcano Job %s (%s %s): delete it by hand", args[-1], name, e.status, e.reason)
            except urllib3.exceptions.HTTPError as e:
                self.log.error("could not delete %s of Volcano Job %s (%s): delete it by hand", args[-1], name, e)

    def state(self, name: str) -> JobState:
        """The Job's phase and what its pods say (LaunchError when the Job is gone)."""
        job = self._call(f"read Volcano Job {name}", self.custom.get_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, name)
        status = job.get("status") or {}
        state = status.get("state") or {}
        phase = state.get("phase") or "Pending"
        message = ": ".join(part for part in (state.get("reason"), state.get("message")) if part)
        waiting, image_error, failure = [], "", ""
        for pod in self.pods(name):
            pod_name, pod_status = pod.metadata.name, pod.status
            for condition in pod_status.conditions or []:
                if condition.type == "PodScheduled" and condition.status == "False":
                    waiting.append(f"{pod_name} not scheduled: {condition.message or condition.reason}")
            for container in pod_status.container_statuses or []:
                if container.state.waiting and container.state.waiting.reason in IMAGE_ERRORS:
                    image_error = f"{pod_name} cannot pull image {container.image}: {container.state.waiting.reason} ({container.state.waiting.message or ''})"
                elif container.state.terminated and container.state.terminated.exit_code:
                    ended = container.state.terminated
                    failure = f"{pod_name}: {ended.reason or 'Error'} (exit code {ended.exit_code})"
            if pod_status.phase == "Failed" and pod_status.reason:  # Evicted: the node, not the process
                failure = f"{pod_name}: {pod_status.reason} ({pod_status.message or ''})"
        return JobState(phase=phase, retries=int(status.get("retryCount") or 0), waiting="; ".join(waiting[:3]), image_error=image_error,
                        failure=failure, message=message)

    def pods(self, name: str) -> list[Any]:
        """The Job's pods."""
        found = self._call(f"list the pods of {name}", self.core.list_namespaced_pod, self.namespace, label_selector=f"{JOB_LABEL}={name}")
        return list(found.items)

    def _watch(self, name: str, manifest: Mapping[str, Any], last_lines: Callable[[], str]) -> None:
        """Wait for the Job to complete; StageFailed when it fails, quoting `last_lines()` (the master's log, read to its end)."""
        queued_since, said, last_failure = self.clock(), "", ""
        while True:
            state = self.state(name)
            last_failure = state.failure or last_failure
            if state.describe() != said:
                said = state.describe()
                self.log.info("Volcano Job %s: %s", name, said)
            if state.image_error:
                raise StageFailed(f"Volcano Job {name}: {state.image_error}. Check the experiment's image and that the cluster may pull "
                                  "it (the registry's imagePullSecret)")
            if state.phase == "Completed":
                return
            if state.phase in FAILED_PHASES:
                why = last_failure or state.message or "no reason given"
                restarts = f"{state.retries} restart" + ("" if state.retries == 1 else "s")
                raise StageFailed(f"Volcano Job {name} {state.phase.lower()} after {restarts} (maxRetry "
                                  f"{manifest['spec'].get('maxRetry')}): {why}" + last_lines())
            if state.phase == "Running":
                queued_since = None
            elif queued_since is None:
                queued_since = self.clock()
            if queued_since is not None and self.schedule_timeout_s is not None and self.clock() - queued_since > self.schedule_timeout_s:
                raise StageFailed(
                    f"Volcano Job {name} was not scheduled within {self.schedule_timeout_s:g} s in queue {manifest['spec']['queue']}: "
                    f"{state.waiting or state.message or 'the scheduler gave no reason'}. Ask for fewer nodes or GPUs (resources), "
                    "use another queue, or raise kubernetes.schedule_timeout_s"
                )
            time.sleep(self.poll_s)

    def _wait_gone(self, name: str, timeout_s: float = 60.0) -> None:
        deadline = self.clock() + timeout_s
        while self.clock() < deadline:
            try:
                self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
            except ApiException as e:
                if e.status == 404:
                    return
            time.sleep(min(self.poll_s, 1.0))

    def _call(self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except ApiException as e:
            if e.status == 409:
                raise _Conflict(what) from e
            raise LaunchError(f"could not {what}: {_api_problem(e, self.namespace)}") from e
        except urllib3.exceptions.HTTPError as e:
            raise LaunchError(f"could not {what}: the Kubernetes API at {self.host} is unreachable ({e})") from e

    def follow_log(self, pod: str) -> Iterator[str]:
        """The pod's log lines from its start, as they are written, until the container ends."""
        response = self.core.read_namespaced_pod_log(pod, self.namespace, container=CONTAINER, follow=True, _preload_content=False)
        pending = b""
        try:
            for chunk in response.stream(4096):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", "replace")
            if pending:
                yield pending.decode("utf-8", "replace")
        finally:
            response.release_conn()


class _Conflict(Exception):
    """The object exists already (HTTP 409)."""


FAILED_LOG_WAIT_S = 10.0
"""How long a failed Job's message waits for the log follower to read what the master wrote before it died."""


class _LogFollower:
    """A thread following the master pod's log; a restarted gang's new master pod is followed from its start."""

    def __init__(self, jobs: VolcanoJobs, name: str, on_line: Callable[[str], Any]) -> None:
        self.jobs, self.name, self.on_line = jobs, name, on_line
        self.pod = f"{name}-{MASTER}-0"
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"logs-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self, timeout_s: float = 30.0) -> None:
        """Let the follower read the rest of the master's log (the Job completed)."""
        self._done = True
        self._thread.join(timeout_s)

    def stop(self) -> None:
        self._stopping.set()

    _done = False

    def _follow(self) -> None:
        followed: set[str] = set()
        while not self._stopping.is_set():
            uid = self._started_master()
            if uid is None or uid in followed:
                if self._done:
                    return
                self._stopping.wait(0.5)
                continue
            followed.add(uid)
            try:
                for line in self.jobs.follow_log(self.pod):
                    if self._stopping.is_set():
                        return
                    self.on_line(line)
            except (ApiException, urllib3.exceptions.HTTPError) as e:
                if not self._stopping.is_set():
                    self.jobs.log.warning("following the log of %s stopped (%s); the Job is still watched", self.pod, e)

    def _started_master(self) -> str | None:
        """The uid of the master pod once its container has started (None before, or when it cannot be read)."""
        try:
            pod = self.jobs.core.read_namespaced_pod(self.pod, self.jobs.namespace)
        except (ApiException, urllib3.exceptions.HTTPError):
            return None
        return pod.metadata.uid if pod.status.phase in ("Running", "Succeeded", "Failed") else None


def _keep(tail: collections.deque[str], text: str | None) -> None:
    if text is not None:
        tail.append(text)


def _tail(lines: collections.deque[str]) -> str:
    return ("\nlast lines of the master pod's log:\n" + "\n".join(lines)) if lines else ""


def _api_problem(error: ApiException, namespace: str) -> str:
    """What the API server said, and what to change."""
    try:
        said = json.loads(error.body or "{}").get("message") or error.reason
    except ValueError:
        said = error.reason
    hint = {
        401: "the credentials were refused: check the kubeconfig or the service account token",
        403: f"the launcher's service account may not do this in namespace {namespace}: apply deploy/namespace-rbac.yaml",
        404: "not found: is Volcano installed (batch.volcano.sh/v1alpha1 jobs) and does the namespace exist?",
        422: "the cluster refused the manifest",
    }.get(error.status, "")
    return f"{error.status} {said}" + (f"; {hint}" if hint else "")
