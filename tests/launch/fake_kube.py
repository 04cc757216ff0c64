"""A TEST DOUBLE of a Kubernetes API server with Volcano on it, for the Volcano launcher's tests.

No Kubernetes API server can run on these machines, so this one speaks the small subset of the REST API the
launcher uses (ConfigMaps, Volcano Jobs, pods, pod logs), over real HTTP, to the real `kubernetes` client. Its
"Volcano controller" turns a Job into pods (a gang: all or none), gives each the pytorch plugin's environment
(WORLD_SIZE pods, RANK, MASTER_ADDR, MASTER_PORT), applies the Job's policies (PodEvicted / PodFailed ->
RestartJob up to maxRetry, the master's TaskCompleted -> CompleteJob) and its "kubelet" runs each pod's command
as a local process, with `$(VAR)` expanded from the pod's env as Kubernetes does, and its output as the pod log.

What it fakes and how: images are not pulled (the command runs with this machine's Python environment on
PATH); a ConfigMap volume is a directory of files and its mount path is rewritten in the command's arguments;
other volumes are this machine's own paths; every pod runs on 127.0.0.1. A pod's process is forked from a warm
interpreter (`factory.launch.warm`) that imported the stages' code in the containers' base environment, as a local
stage's is, with torchrun's ranks forked the same way (`factory.launch.local.forking`): a cold start costs a pod seconds
of imports per process, and pods are many here (a gang, restarts, every stage); the kubelet starts it cold when the
interpreter refuses (its `refused` says why; `starts` counts both). So the pods here do not exercise a cold container
start under the real torchrun, which the launcher cannot tell apart; a value a library derives from HOME as it is
imported is the cluster root's, not the pod's; and the pods share the test's process group. Faults are injected with `inject`:
`evict` and `oom` (kill a running gang), `image_pull` (pods never start), `unschedulable` (the queue has no room).
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import psutil

from factory.launch.local import RANK_LOGS_ENV, TORCHRUN, forking
from factory.launch.warm import WarmProcess, WarmServer
from factory.runtime import every_warm_module

JOB_LABEL = "volcano.sh/job-name"
ROUTES = [
    ("configmaps", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/configmaps(?:/(?P<name>[^/]+))?$")),
    ("jobs", re.compile(r"^/apis/batch\.volcano\.sh/v1alpha1/namespaces/(?P<ns>[^/]+)/jobs(?:/(?P<name>[^/]+))?$")),
    ("log", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/log$")),
    ("pods", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+))?$")),
]
BIN = Path(sys.executable).parent
PATH = f"{BIN}:/usr/local/bin:/usr/bin:/bin"
"""A container's PATH: this machine's Python environment stands in for the image."""


@dataclass
class Fault:
    kind: str
    """evict, oom, image_pull or unschedulable."""
    job: str
    """Jobs whose name starts with this suffer it."""
    after: str | None = None
    """evict/oom: a regex the master's log must show first (None: as soon as the gang runs)."""
    times: int = 1


@dataclass
class PodRun:
    pod: dict[str, Any]
    log: Path
    process: subprocess.Popen | Forked | None = None


class Forked:
    """A pod's process forked from the warm interpreter: what the kubelet uses of `subprocess.Popen`, safe to ask from
    the cluster's threads at once (a WarmProcess reads its exit from one socket)."""

    def __init__(self, process: WarmProcess) -> None:
        self.pid = process.pid
        self._process = process
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            return self._process.poll()

    def wait(self) -> int:
        while (code := self.poll()) is None:
            time.sleep(0.02)
        return code


class FakeCluster:
    """The API server (HTTP on 127.0.0.1), the Volcano controller and the kubelet, in threads of the test process."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.warm: WarmServer | None = None
        self.starts = {"forked": 0, "cold": 0}
        """How many pod processes started each way."""
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.runs: dict[tuple[str, str], PodRun] = {}
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str]] = []
        self.posted: dict[str, dict[str, Any]] = {}
        """Each Job as it was submitted, by name (kept after the Job is deleted)."""
        self.attempts: dict[str, int] = {}
        """Gangs started per Job name."""
        self.lock = threading.RLock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self._serving = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeCluster:
        if sys.platform == "linux":
            self.warm = WarmServer(every_warm_module(), self._base_env(self.root))
        self._serving.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        with self.lock:
            for key in list(self.runs):
                self._kill(key)
        self.server.shutdown()
        self.server.server_close()
        if self.warm is not None:
            self.warm.close()

    def kubeconfig(self, path: Path, namespace: str = "model-factory") -> Path:
        """A kubeconfig that points the real client at this server."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "not-a-secret"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester", "namespace": namespace}}],
        }))
        return path

    def inject(self, kind: str, job: str, after: str | None = None, times: int = 1) -> None:
        """The next `times` gangs started of Jobs whose name starts with `job` suffer `kind`."""
        self.faults.append(Fault(kind=kind, job=job, after=after, times=times))

    def names(self, kind: str) -> list[str]:
        """The names of the objects of one kind (configmaps, jobs, pods) that exist now."""
        with self.lock:
            return sorted(name for (k, _, name) in self.objects if k == kind)

    def running_processes(self) -> int:
        with self.lock:
            return sum(1 for run in self.runs.values() if run.process is not None and run.process.poll() is None)

    # The API server.

    def handle(self, method: str, kind: str, ns: str, name: str | None, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        if method == "POST" and name is None and body:
            name = body["metadata"]["name"]
        self.requests.append((method, f"{kind}/{name or ''}"))
        with self.lock:
            if method == "POST" and kind in ("configmaps", "jobs"):
                if (kind, ns, name) in self.objects:
                    return 409, _status(409, "AlreadyExists", f'{kind} "{name}" already exists')
                body.setdefault("metadata", {})["namespace"] = ns
                body["metadata"]["uid"] = str(uuid.uuid4())
                self.objects[(kind, ns, name)] = body
                if kind == "jobs":
                    self.posted[name] = copy.deepcopy(body)
                    body["status"] = {"state": {"phase": "Pending"}, "retryCount": 0}
                    threading.Thread(target=self._control, args=(ns, name), daemon=True).start()
                return 201, body
            if method == "GET" and kind == "pods" and name is None:
                selector = query.get("labelSelector", [""])[0]
                wanted = dict(part.split("=", 1) for part in selector.split(",") if part)
                items = [o for (k, n, _), o in self.objects.items() if k == "pods" and n == ns
                         and all(o["metadata"]["labels"].get(key) == value for key, value in wanted.items())]
                return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
            found = self.objects.get((kind, ns, name or ""))
            if found is None:
                return 404, _status(404, "NotFound", f'{kind} "{name}" not found')
            if method == "GET":
                return 200, found
            if method == "DELETE":
                del self.objects[(kind, ns, name)]
                if kind == "jobs":
                    self._delete_pods(ns, name)
                return 200, _status(200, "", "deleted") | {"status": "Success"}
        return 405, _status(405, "MethodNotAllowed", f"{method} {kind}")

    def started(self, ns: str, name: str) -> PodRun | None:
        """The pod's container, when it has started (its log exists)."""
        with self.lock:
            run = self.runs.get((ns, name))
        return run if run is not None and run.log.exists() else None

    def stream_log(self, ns: str, name: str, run: PodRun, follow: bool, write: Any) -> None:
        """Write the pod's log, following it until the container ends."""
        offset = 0
        while True:
            with open(run.log, "rb") as f:
                f.seek(offset)
                data = f.read()
            if data:
                offset += len(data)
                write(data)
            ended = run.process is None or run.process.poll() is not None or (ns, name) not in self.runs
            if not follow or (ended and not data):
                return
            time.sleep(0.05)

    # The Volcano controller.

    def _control(self, ns: str, name: str) -> None:
        while True:
            with self.lock:
                job = self.objects.get(("jobs", ns, name))
                if job is None:
                    return
                fault = self._take_fault(name)
                self.attempts[name] = self.attempts.get(name, 0) + 1
                pods = self._create_pods(ns, name, job, fault)
            if fault is not None and fault.kind in ("unschedulable", "image_pull"):
                return  # stays so until the launcher gives up and deletes the Job
            event = self._supervise(ns, name, pods, fault)
            with self.lock:
                job = self.objects.get(("jobs", ns, name))
                if job is None or event is None:
                    return
                status = job["status"]
                if event == "TaskCompleted":  # the other pods are killed; finished ones stay until the Job is deleted
                    self._delete_pods(ns, name, keep_finished=True)
                    status["state"] = {"phase": "Completed"}
                    return
                for pod_name in pods:
                    self._kill((ns, pod_name))
                action = next((p["action"] for p in job["spec"].get("policies", []) if p.get("event") == event), None)
                if action == "RestartJob" and status["retryCount"] < job["spec"].get("maxRetry", 3):
                    self._delete_pods(ns, name)
                    status["retryCount"] += 1
                    status["state"] = {"phase": "Restarting", "reason": event}
                    continue
                status["state"] = {"phase": "Failed", "reason": event, "message": "retries exhausted" if action else "no policy restarts it"}
                return

    def _take_fault(self, name: str) -> Fault | None:
        fault = next((f for f in self.faults if name.startswith(f.job)), None)
        if fault is not None:
            fault.times -= 1
            if fault.times <= 0:
                self.faults.remove(fault)
        return fault

    def _create_pods(self, ns: str, name: str, job: dict[str, Any], fault: Fault | None) -> list[str]:
        tasks = job["spec"]["tasks"]
        world = sum(task["replicas"] for task in tasks)
        port = _free_port()
        names, rank = [], 0
        for task in tasks:
            for index in range(task["replicas"]):
                pod_name = f"{name}-{task['name']}-{index}"
                template = json.loads(json.dumps(task["template"]))
                env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world), "RANK": str(rank)}
                pod = {"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": pod_name, "namespace": ns, "uid": str(uuid.uuid4()),
                                    "labels": {**template.get("metadata", {}).get("labels", {}), JOB_LABEL: name, "volcano.sh/task-spec": task["name"]}},
                       "spec": template["spec"], "status": {"phase": "Pending", "conditions": []}}
                container = template["spec"]["containers"][0]
                if fault is not None and fault.kind == "unschedulable":
                    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                    "message": f"queue {job['spec']['queue']} is full: 0/3 nodes are available, insufficient nvidia.com/gpu"}]
                elif fault is not None and fault.kind == "image_pull":
                    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
                    pod["status"]["containerStatuses"] = [_container_status(container, {"waiting": {
                        "reason": "ImagePullBackOff", "message": f'Back-off pulling image "{container["image"]}"'}})]
                else:
                    pod["status"] = {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}],
                                     "containerStatuses": [_container_status(container, {"running": {"startedAt": _now()}})]}
                    self.runs[(ns, pod_name)] = self._start(ns, pod_name, pod, container, env)
                self.objects[("pods", ns, pod_name)] = pod
                names.append(pod_name)
                rank += 1
        if fault is None or fault.kind not in ("unschedulable", "image_pull"):
            job["status"]["state"] = {"phase": "Running"}
        return names

    def _supervise(self, ns: str, name: str, pods: list[str], fault: Fault | None) -> str | None:
        """Wait for the gang: TaskCompleted (the master succeeded), PodFailed or PodEvicted; None when the Job was deleted."""
        master = pods[0]
        while True:
            time.sleep(0.05)
            with self.lock:
                if ("jobs", ns, name) not in self.objects:
                    return None
                if fault is not None and fault.kind in ("evict", "oom") and self._due(ns, master, fault):
                    return self._fail(ns, pods, fault)
                for pod_name in pods:
                    run = self.runs.get((ns, pod_name))
                    code = run.process.poll() if run and run.process else None
                    if code is None:
                        continue
                    pod = self.objects[("pods", ns, pod_name)]
                    pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
                    pod["status"]["containerStatuses"] = [_container_status(pod["spec"]["containers"][0], {"terminated": {
                        "exitCode": code if code >= 0 else 128 - code, "reason": "Completed" if code == 0 else "Error"}})]
                    if code != 0:
                        return "PodFailed"
                    if pod_name == master:
                        return "TaskCompleted"

    def _due(self, ns: str, master: str, fault: Fault) -> bool:
        run = self.runs.get((ns, master))
        if run is None or not run.log.exists():
            return False
        text = run.log.read_text(errors="replace")
        return bool(text) if fault.after is None else re.search(fault.after, text) is not None

    def _fail(self, ns: str, pods: list[str], fault: Fault) -> str:
        master = self.objects[("pods", ns, pods[0])]
        for pod_name in pods:
            self._kill((ns, pod_name))
        if fault.kind == "oom":
            master["status"]["phase"] = "Failed"
            master["status"]["containerStatuses"] = [_container_status(master["spec"]["containers"][0], {"terminated": {
                "exitCode": 137, "reason": "OOMKilled"}})]
            return "PodFailed"
        master["status"].update(phase="Failed", reason="Evicted", message="The node was low on resource: memory.")
        return "PodEvicted"

    def _delete_pods(self, ns: str, name: str, keep_finished: bool = False) -> None:
        for key in [k for k in self.objects if k[0] == "pods" and k[1] == ns and self.objects[k]["metadata"]["labels"].get(JOB_LABEL) == name]:
            if keep_finished and self.objects[key]["status"]["phase"] == "Succeeded":
                continue
            self._kill((ns, key[2]))
            del self.objects[key]
            self.runs.pop((ns, key[2]), None)

    # The kubelet.

    def _start(self, ns: str, pod_name: str, pod: dict[str, Any], container: dict[str, Any], plugin_env: dict[str, str]) -> PodRun:
        home = self.root / ns / pod_name / pod["metadata"]["uid"]
        home.mkdir(parents=True)
        env = {**self._base_env(home), RANK_LOGS_ENV: str(home / "torchelastic")}  # a container's /tmp goes with it; this machine's stays
        for entry in container.get("env", []):
            if "valueFrom" in entry:
                ref = entry["valueFrom"]["secretKeyRef"]
                env[entry["name"]] = f"secret:{ref['name']}/{ref['key']}"
            else:
                env[entry["name"]] = _expand(entry["value"], env)
        env.update(plugin_env)  # the pytorch plugin's, appended last
        mounts = {}
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            source = volumes[mount["name"]].get("configMap")
            if source is not None:
                data = self.objects[("configmaps", ns, source["name"])]["data"]
                directory = home / mount["name"]
                directory.mkdir()
                for item in source.get("items", [{"key": key, "path": key} for key in data]):
                    (directory / item["path"]).write_text(data[item["key"]])
                mounts[mount["mountPath"]] = str(directory)
        argv = [_expand(arg, env) for arg in container["command"]]
        for path, local in mounts.items():
            argv = [arg.replace(path, local) for arg in argv]
        log = home / "container.log"
        with open(log, "wb") as out:
            process = self._fork(argv, env, home, out.fileno()) or subprocess.Popen(
                argv, env=env, cwd=home, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts["forked" if isinstance(process, Forked) else "cold"] += 1
        return PodRun(pod=pod, log=log, process=process)

    @staticmethod
    def _base_env(home: Path) -> dict[str, str]:
        """What every container's environment holds before the pod's own variables (LANG as Python's images set it)."""
        return {"PATH": PATH, "HOME": str(home), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}

    def _fork(self, argv: list[str], env: dict[str, str], home: Path, log: int) -> Forked | None:
        """The container's command forked from the warm interpreter, writing to `log`; None when it cannot be."""
        if self.warm is None:
            return None
        if argv[0] == "torchrun":
            argv = [sys.executable, "-m", TORCHRUN, *argv[1:]]
        argv, needs = forking(argv, [])
        base = self._base_env(self.root)
        own = [name for name, value in env.items() if base.get(name) != value]  # the pod's: read as it runs, not at import
        process = self.warm.spawn(argv, env, own, needs, cwd=home, stdout=log, stderr=log)
        return None if process is None else Forked(process)

    def _kill(self, key: tuple[str, str]) -> None:
        """Kill the container: every process in it (torchrun starts its ranks in sessions of their own)."""
        run = self.runs.get(key)
        if run is None or run.process is None or run.process.poll() is not None:
            return
        try:
            family = [psutil.Process(run.process.pid), *psutil.Process(run.process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            family = []
        for member in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
        psutil.wait_procs(family, timeout=30)
        run.process.wait()


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: a defined variable is replaced, `$$` is one `$`, anything else stays."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def _container_status(container: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    return {"name": container["name"], "image": container["image"], "imageID": "", "ready": "running" in state, "restartCount": 0,
            "state": state}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": message, "metadata": {}}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _handler(cluster: FakeCluster) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _route(self, method: str) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            for kind, pattern in ROUTES:
                match = pattern.match(url.path)
                if match is None:
                    continue
                if kind == "log":
                    cluster.requests.append((method, f"log/{match['name']}"))
                    run = cluster.started(match["ns"], match["name"])
                    if run is None:
                        return self._json(400, _status(400, "BadRequest", f'container "stage" in pod "{match["name"]}" is waiting to start'))
                    self.send_response(200)  # no Content-Length: the body ends when the connection closes (HTTP/1.0)
                    self.send_header("Content-Type", "text/plain")
                    self.end_headers()

                    def write(data: bytes) -> None:
                        self.wfile.write(data)
                        self.wfile.flush()

                    cluster.stream_log(match["ns"], match["name"], run, query.get("follow", ["false"])[0] == "true", write)
                    return None
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                code, payload = cluster.handle(method, kind, match["ns"], match["name"], query, body)
                return self._json(code, payload)
            self._json(404, _status(404, "NotFound", f"no route for {url.path}"))

        def _json(self, code: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def do_DELETE(self) -> None:
            self._route("DELETE")

    return Handler

