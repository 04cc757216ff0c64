"""deploy/ beyond the manifests: the Dagster Helm values, the image and the kind quickstart agree with the manifests,
with pyproject.toml and with the launcher; every Kubernetes fragment among them validates strictly; no credential is
written down.

Each family of checks is a function that returns the problems it finds, and each has a test showing that it finds
one in a mutated copy: a check that cannot fail checks nothing.
"""

from __future__ import annotations

import copy
import re
import shlex
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from factory.cli.common import DAGSTER_POSTGRES_YAML
from factory.config import load_file
from factory.config.cluster import ClusterProfile, load_profile
from factory.launch.volcano import dry_run
from factory.launch.volcano_manifest import RUN_AS, SECRET_NAME
from factory.launch.volcano_rules import KUBERNETES_VERSION
from factory.preflight import check_files

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
VALUES = DEPLOY / "helm" / "dagster-values.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
README = DEPLOY / "README.md"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
MODULE = PYPROJECT["tool"]["dagster"]["module_name"]
PLACEHOLDER_IMAGE = "registry.example.com/ml/model-factory:test"
DIGEST = "ab" * 32

CREDENTIAL_KEY = re.compile(r"password|passwd|token|secret|credential|api_?key|private_?key", re.IGNORECASE)
"""Keys whose value would be a credential if it were written down."""
REFERENCE_KEY = re.compile(r"[sS]ecretName$|^envSecrets$|^secretRef$|^secretKeyRef$|^imagePullSecrets$")
"""Keys whose value names a Secret (a reference, never the credential itself)."""
URL_WITH_PASSWORD = re.compile(r"://[^/\s:@]+:[^/\s@]+@")
IGNORED = (".git", ".venv", ".factory", ".env")
"""What the build context must leave out: history, local installs, the embedded instance, local credentials."""


def pin(package: str) -> str:
    """The version pyproject.toml pins `package` to (`name==version`)."""
    [version] = [dep.split("==", 1)[1] for dep in PYPROJECT["project"]["dependencies"] if dep.split("==", 1)[0] == package]
    return version


def manifests() -> list[dict]:
    return [doc for path in sorted(DEPLOY.glob("*.yaml")) if path.name != "cluster-profile.yaml"
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def the(kind: str) -> dict:
    [doc] = [doc for doc in manifests() if doc["kind"] == kind]
    return doc


def values() -> dict:
    return yaml.safe_load(VALUES.read_text())


def at(tree: dict, *path: str) -> Any:
    for key in path:
        tree = tree[key]
    return tree


# --- the Kubernetes fragments of the values, each wrapped into a Pod ---------------------------------------------

def workloads(vals: dict) -> dict[str, dict]:
    """Each pod the values describe -> its pod-level and container-level fields, as the chart passes them on."""
    launcher = at(vals, "runLauncher", "config", "k8sRunLauncher")
    found = {"run worker": {
        "securityContext": launcher.get("runK8sConfig", {}).get("podSpecConfig", {}).get("securityContext"),
        "volumes": launcher.get("volumes"),
        "container": {"envFrom": [{"secretRef": s} for s in launcher.get("envSecrets", [])], "resources": launcher.get("resources"),
                      "securityContext": launcher.get("securityContext"), "volumeMounts": launcher.get("volumeMounts")},
    }}
    for deployment in at(vals, "dagster-user-deployments", "deployments"):
        found[f"code location {deployment['name']}"] = {
            "securityContext": deployment.get("podSecurityContext"),
            "volumes": deployment.get("volumes"),
            "container": {"env": deployment.get("env"), "envFrom": [{"secretRef": s} for s in deployment.get("envSecrets", [])],
                          "resources": deployment.get("resources"), "securityContext": deployment.get("securityContext"),
                          "volumeMounts": deployment.get("volumeMounts")},
        }
    return found


def as_pod(name: str, workload: dict) -> dict:
    """A minimal Pod holding the workload's fragments (empty ones left out), for the schema to judge."""
    container = {"name": "main", "image": PLACEHOLDER_IMAGE, **{k: v for k, v in workload["container"].items() if v}}
    spec = {"containers": [container], **{k: workload[k] for k in ("securityContext", "volumes") if workload[k]}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": re.sub(r"[^a-z0-9]+", "-", name)}, "spec": spec}


@pytest.mark.parametrize("name", sorted(workloads(values())))
def test_every_kubernetes_fragment_of_the_values_validates_strictly(name):
    kubernetes_validate.validate(as_pod(name, workloads(values())[name]), KUBERNETES_VERSION, strict=True)


def test_a_misspelt_fragment_of_the_values_is_refused():
    vals = values()
    at(vals, "runLauncher", "config", "k8sRunLauncher", "volumeMounts")[0]["mountpath"] = "/store"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(as_pod("run worker", workloads(vals)["run worker"]), KUBERNETES_VERSION, strict=True)


# --- no credential written down -----------------------------------------------------------------------------------

def inlined_credentials(node: Any, path: str = "") -> list[str]:
    """Every place a credential is written as a value rather than named by a Secret reference."""
    found = []
    if isinstance(node, dict):
        name = node.get("name")
        if isinstance(name, str) and "value" in node and SECRET_NAME.search(name):
            found.append(f"{path}: {name} has a plain value; take it from a Secret (valueFrom.secretKeyRef or envSecrets)")
        for key, value in node.items():
            here = f"{path}.{key}" if path else str(key)
            written = isinstance(value, (str, int, float)) and not isinstance(value, bool) and value != ""
            if CREDENTIAL_KEY.search(str(key)) and not REFERENCE_KEY.search(str(key)) and written:
                found.append(f"{here}: a credential written into the values; reference a Secret instead")
            found += inlined_credentials(value, here)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            found += inlined_credentials(item, f"{path}[{index}]")
    elif isinstance(node, str) and URL_WITH_PASSWORD.search(node):
        found.append(f"{path}: a URL with a password in it")
    return found


def test_the_values_name_secrets_and_inline_no_credential():
    vals = values()
    assert inlined_credentials(vals) == []
    assert vals["generatePostgresqlPasswordSecret"] is False and vals["global"]["postgresqlSecretName"]
    assert vals["postgresql"]["enabled"] is False and "postgresqlPassword" not in vals["postgresql"]


@pytest.mark.parametrize("mutate", [
    lambda v: v["postgresql"].update(postgresqlPassword="hunter2"),
    lambda v: v["dagster-user-deployments"]["deployments"][0]["env"].append({"name": "NEPTUNE_API_TOKEN", "value": "abc"}),
    lambda v: v["dagster-user-deployments"]["deployments"][0]["env"].append(
        {"name": "FACTORY_TRACKER_URI", "value": "https://ml:pw@mlflow.example.com"}),
], ids=["password", "token-env", "url-with-password"])
def test_a_credential_written_into_the_values_is_found(mutate):
    vals = values()
    mutate(vals)
    assert inlined_credentials(vals)


# --- the values agree with the manifests ----------------------------------------------------------------------------

def disagreements(vals: dict, objects: list[dict]) -> list[str]:
    """Where the values name a namespace, account, claim or user other than deploy/*.yaml and RUN_AS do."""
    [namespace] = [o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"]
    [account] = [o for o in objects if o["kind"] == "ServiceAccount"]
    [claim] = [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    found = [f"{o['kind']}/{o['metadata']['name']} is in {o['metadata'].get('namespace')!r}, not {namespace!r}"
             for o in (account, claim) if o["metadata"].get("namespace") != namespace]
    if (job_namespace := at(vals, "runLauncher", "config", "k8sRunLauncher").get("jobNamespace")) != namespace:
        found.append(f"runLauncher jobNamespace {job_namespace!r} is not {namespace!r}")
    user_deployments = vals["dagster-user-deployments"]
    if user_deployments["serviceAccount"] != {"create": False, "name": account["metadata"]["name"]}:
        found.append(f"the code location's account {user_deployments['serviceAccount']} is not the existing "
                     f"{account['metadata']['name']!r}")
    if user_deployments.get("rbacEnabled", True) or vals.get("global", {}).get("serviceAccountName"):
        found.append("the launcher's account would get more than deploy/namespace-rbac.yaml grants, or lend it to the webserver")
    pods = workloads(vals)
    if len({yaml.safe_dump([w["volumes"], w["container"]["volumeMounts"]]) for w in pods.values()}) != 1:
        found.append("the run worker's store volume and mount differ from the code location's (dagster-k8s merges them)")
    for name, workload in pods.items():
        volumes = {v["name"]: v for v in workload["volumes"] or []}
        claims = [v["persistentVolumeClaim"]["claimName"] for v in volumes.values() if "persistentVolumeClaim" in v]
        if claims != [claim["metadata"]["name"]]:
            found.append(f"{name} mounts claims {claims}, not {claim['metadata']['name']!r}")
        found += [f"{name}: mount {m['name']!r} names no volume" for m in workload["container"]["volumeMounts"] or []
                  if m["name"] not in volumes]
        security = workload["securityContext"] or {}
        ids = [security.get(key) for key in ("runAsUser", "runAsGroup", "fsGroup")]
        if ids != [RUN_AS] * 3 or not security.get("runAsNonRoot"):
            found.append(f"{name} does not run as RUN_AS ({RUN_AS}), non-root")
    return found


def test_the_values_name_the_namespace_account_claim_and_user_deployed():
    assert disagreements(values(), manifests()) == []
    assert the("PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteMany"]


@pytest.mark.parametrize("mutate", [
    lambda v, m: v["runLauncher"]["config"]["k8sRunLauncher"].update(jobNamespace="default"),
    lambda v, m: v["dagster-user-deployments"]["serviceAccount"].update(name="default"),
    lambda v, m: v["dagster-user-deployments"]["deployments"][0]["volumes"][0]["persistentVolumeClaim"].update(claimName="other"),
    lambda v, m: v["dagster-user-deployments"]["deployments"][0]["podSecurityContext"].update(runAsUser=0),
    lambda v, m: [o["metadata"].update(name="renamed") for o in m if o["kind"] == "PersistentVolumeClaim"],
], ids=["job-namespace", "service-account", "claim", "user", "renamed-claim"])
def test_a_name_that_drifts_from_the_manifests_is_found(mutate):
    vals, objects = values(), copy.deepcopy(manifests())
    mutate(vals, objects)
    assert disagreements(vals, objects)


# --- the release's instance settings -------------------------------------------------------------------------------

def instance_drift(vals: dict) -> list[str]:
    """Each setting of the dagster.yaml `factory` writes for the deploy profile that the release's instance lacks or gives
    another value (storage aside: the chart writes its own). The chart writes `telemetry` itself, from its own value."""
    release = {**vals.get("additionalInstanceConfig", {}), "telemetry": vals.get("telemetry", {"enabled": True})}
    written = yaml.safe_load(DAGSTER_POSTGRES_YAML)
    return [f"{key}: the values give {release.get(key)!r}, factory writes {value!r}"
            for key, value in written.items() if key != "storage" and release.get(key) != value]


def test_the_release_instance_has_the_settings_factory_writes():
    assert instance_drift(values()) == []
    assert values()["additionalInstanceConfig"]["nux"] == {"enabled": False}  # no community dialog over the asset graph


@pytest.mark.parametrize("mutate", [
    lambda v: v["additionalInstanceConfig"].pop("nux"),
    lambda v: v.pop("telemetry"),
    lambda v: v["additionalInstanceConfig"]["concurrency"]["pools"].update(default_limit=4),
], ids=["nux", "telemetry", "pools"])
def test_an_instance_setting_that_drifts_is_found(mutate):
    vals = values()
    mutate(vals)
    assert instance_drift(vals)


# --- the image ------------------------------------------------------------------------------------------------------

def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comments and blank lines dropped, lines ending in a backslash joined."""
    instructions, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # Docker drops comment lines, within a continuation too
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    if pending:
        raise ValueError("the Dockerfile ends inside a continued line")
    return instructions


def arguments(instructions: list[tuple[str, str]], keyword: str) -> list[str]:
    return [args for word, args in instructions if word == keyword]


def declared(instructions: list[tuple[str, str]]) -> Iterator[tuple[str, str, str | None]]:
    """(ENV or ARG, name, value or None) for every variable the Dockerfile declares."""
    for word, args in instructions:
        if word == "ARG":
            name, _, value = args.partition("=")
            yield word, name, value if "=" in args else None
        elif word == "ENV":
            pairs = shlex.split(args)
            if pairs and "=" not in pairs[0]:  # the legacy `ENV NAME value` form
                pairs = [f"{pairs[0]}={' '.join(pairs[1:])}"]
            yield from ((word, *pair.split("=", 1)) for pair in pairs)


def base_problem(image: str) -> str | None:
    """Why a FROM image is not pinned, or None."""
    if "$" in image:
        return f"FROM {image}: a variable; pin the base literally"
    if "@sha256:" in image:
        return None
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:
        return f"FROM {image}: no tag; pin one (and a digest in production)"
    return f"FROM {image}: 'latest' moves; pin a version" if tag == "latest" else None


def dockerfile_problems(text: str) -> list[str]:
    """Base pinned, runs as RUN_AS, installs the project at pyproject's pins, no credentials, a WORKDIR."""
    instructions = parse_dockerfile(text)
    found = [problem for args in arguments(instructions, "FROM")
             if (problem := base_problem([word for word in args.split() if not word.startswith("--")][0]))]
    users = arguments(instructions, "USER")
    if not users or users[-1].split(":") not in ([str(RUN_AS)], [str(RUN_AS), str(RUN_AS)]):
        found.append(f"USER {users[-1] if users else '(none)'}: run as uid and gid {RUN_AS} (RUN_AS), by number")
    installs = [shlex.split(args) for args in arguments(instructions, "RUN") if "pip install" in args]
    if not any("." in tokens or any(t.startswith(".[") for t in tokens) for tokens in installs):
        found.append("no `pip install .`: the image must install the project itself")
    elif not any(t.startswith(".[") and "ray" in t[2:-1].split(",") for tokens in installs for t in tokens):
        found.append("the project is installed without its `ray` extra: deploy/ray-cluster.yaml's pods run this image")
    found += [f"{word} {name}: a credential-looking variable; pass credentials at run time from a Secret"
              for word, name, value in declared(instructions)
              if SECRET_NAME.search(name) or CREDENTIAL_KEY.search(name) or URL_WITH_PASSWORD.search(value or "")]
    defaults = {name: value for word, name, value in declared(instructions) if word == "ARG"}
    major, minor, patch = pin("dagster").split(".")
    expected = {"TORCH_VERSION": pin("torch"), "DAGSTER_LIBRARIES_VERSION": f"0.{int(minor) + 16}.{patch}"}
    found += [f"ARG {name}={defaults.get(name)}: pyproject.toml pins {version}" for name, version in expected.items()
              if defaults.get(name) != version]
    if not arguments(instructions, "WORKDIR"):
        found.append("no WORKDIR")
    return found


def test_the_dockerfile_parser_joins_continued_lines_and_drops_comments():
    text = "# syntax=docker/dockerfile:1\nFROM a:1\nRUN one \\\n  # inside\n  two\n\nuser 7\n"
    assert parse_dockerfile(text) == [("FROM", "a:1"), ("RUN", "one two"), ("USER", "7")]
    with pytest.raises(ValueError, match="continued"):
        parse_dockerfile("RUN one \\\n")


def test_the_image_is_pinned_runs_as_run_as_and_installs_the_project():
    assert dockerfile_problems(DOCKERFILE.read_text()) == []


@pytest.mark.parametrize(("old", "new"), [
    ("FROM python:3.11-slim-bookworm", "FROM python:latest"),
    ("FROM python:3.11-slim-bookworm", "FROM python"),
    ("USER 1000:1000", "USER root"),
    ("USER 1000:1000\n", ""),
    ('RUN pip install ".[ray]" "dagster-k8s', 'RUN pip install "dagster-k8s'),
    ('RUN pip install ".[ray]"', 'RUN pip install .'),
    ("WORKDIR /opt/factory\n", "WORKDIR /opt/factory\nENV NEPTUNE_API_TOKEN=abc\n"),
    ("WORKDIR /opt/factory\n", "WORKDIR /opt/factory\nARG HF_TOKEN\n"),
    ("ARG TORCH_INDEX_URL=https://", "ARG TORCH_INDEX_URL=https://me:pw@"),
    ("ARG TORCH_VERSION=2.13.0", "ARG TORCH_VERSION=2.12.0"),
    ("WORKDIR /opt/factory\n", ""),
], ids=["latest", "untagged", "root", "no-user", "no-project", "no-ray", "env-token", "arg-token", "url-with-password", "torch-drift",
     "no-workdir"])
def test_a_dockerfile_that_breaks_a_rule_is_refused(old, new):
    text = DOCKERFILE.read_text()
    assert old in text
    assert dockerfile_problems(text.replace(old, new, 1))


def context_problems(ignore: str) -> list[str]:
    patterns = {line.strip().strip("/") for line in ignore.splitlines() if line.strip() and not line.startswith("#")}
    return [f".dockerignore lets {name} into the build context" for name in IGNORED if name not in patterns]


def test_the_build_context_leaves_local_state_out():
    assert context_problems((ROOT / ".dockerignore").read_text()) == []
    assert context_problems((ROOT / ".dockerignore").read_text().replace(".venv\n", ""))


# --- the code location ------------------------------------------------------------------------------------------------

def code_location_problems(vals: dict, dockerfile: str, module: str) -> list[str]:
    """The chart and the image's default command both serve `module`, on the same port, with nothing in front."""
    found = []
    instructions = parse_dockerfile(dockerfile)
    for deployment in at(vals, "dagster-user-deployments", "deployments"):
        if deployment.get("dagsterApiGrpcArgs") != ["-m", module]:
            found.append(f"code location {deployment['name']} serves {deployment.get('dagsterApiGrpcArgs')}, not -m {module}")
        command = ["dagster", "api", "grpc", "-h", "0.0.0.0", "-p", str(deployment["port"]), "-m", module]
        if [yaml.safe_load(args) for args in arguments(instructions, "CMD")] != [command]:
            found.append(f"the image's CMD is not {command}")
    if arguments(instructions, "ENTRYPOINT"):
        found.append("an ENTRYPOINT: the chart's args and a Volcano Job's command must each replace the whole command")
    return found


def test_the_code_location_serves_the_module_pyproject_names():
    assert code_location_problems(values(), DOCKERFILE.read_text(), MODULE) == []
    assert code_location_problems(values(), DOCKERFILE.read_text(), "assets.elsewhere")
    assert code_location_problems(values(), DOCKERFILE.read_text() + 'ENTRYPOINT ["tini", "--"]\n', MODULE)


# --- the quickstart -----------------------------------------------------------------------------------------------------

def heredocs(text: str) -> dict[str, str]:
    """The README's here-documents by the command that reads them (`kubectl apply -f -`, `cat > FILE`)."""
    found: dict[str, str] = {}
    for command, body in re.findall(r"^([^\n]*?)\s*<<'EOF'\n(.*?)\nEOF$", text, re.MULTILINE | re.DOTALL):
        found[command] = f"{found[command]}\n---\n{body}" if command in found else body
    return found


def readme_problems(text: str) -> list[str]:
    """Files the README does not name by path: every deploy file, so the guide cannot fall behind the folder."""
    paths = [p.relative_to(ROOT).as_posix() for p in (*DEPLOY.glob("*.yaml"), *DEPLOY.glob("helm/*.yaml"), DOCKERFILE)]
    return [f"deploy/README.md does not mention {path}" for path in sorted(paths) if path not in text]


def test_the_readme_names_every_deploy_file_and_the_chart_version():
    text = README.read_text()
    assert readme_problems(text) == []
    assert readme_problems(text.replace("deploy/store-pvc.yaml", "the claim"))
    assert f"--version {pin('dagster')}" in text and f"--version {pin('dagster')}" in VALUES.read_text()


def kind_objects() -> list[dict]:
    return [doc for doc in yaml.safe_load_all(heredocs(README.read_text())["kubectl apply -f -"]) if doc]


@pytest.mark.parametrize("doc", kind_objects(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_the_readmes_kind_objects_validate_strictly(doc):
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_readmes_kind_objects_fit_the_claim_and_the_values():
    objects = {doc["kind"]: doc for doc in kind_objects()}
    claim, volume, vals = the("PersistentVolumeClaim"), objects["PersistentVolume"]["spec"], values()
    assert volume["storageClassName"] == claim["spec"]["storageClassName"]
    assert set(claim["spec"]["accessModes"]) <= set(volume["accessModes"])
    assert volume["claimRef"] == {"namespace": claim["metadata"]["namespace"], "name": claim["metadata"]["name"]}
    postgres, service = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0], objects["Service"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in postgres["env"]}
    database = vals["postgresql"]
    assert env["POSTGRES_PASSWORD"] == {"secretKeyRef": {"name": vals["global"]["postgresqlSecretName"], "key": "postgresql-password"}}
    assert (env["POSTGRES_USER"], env["POSTGRES_DB"]) == (database["postgresqlUsername"], database["postgresqlDatabase"])
    assert service["metadata"]["name"] == vals["postgresql"]["postgresqlHost"]
    assert service["spec"]["ports"][0]["port"] == vals["postgresql"]["service"]["port"]
    namespaces = {o["metadata"].get("namespace") for o in kind_objects() if o["kind"] != "PersistentVolume"}
    assert namespaces == {claim["metadata"]["namespace"]}


def store_block(text: str) -> list[dict]:
    """The values' commented `object store` env entries, uncommented."""
    block = re.search(r"^ *# --- object store ---\n(.*?)^ *# --- end of object store ---$", text, re.MULTILINE | re.DOTALL)
    assert block, "deploy/helm/dagster-values.yaml has a commented `object store` block"
    return yaml.safe_load("\n".join(re.sub(r"^ *# ?", "", line) for line in block[1].splitlines()))


def store_problems(text: str, readme: str) -> list[str]:
    """What in the values' object-store block disagrees with the README's profile (its `store:` and `env_secrets:`)
    or with the variables the store reads."""
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in store_block(text)}
    snippet = re.search(r"^```yaml\n( *store: .*?)^```$", readme, re.MULTILINE | re.DOTALL)
    assert snippet, "deploy/README.md shows the profile's store settings"
    profile = yaml.safe_load(textwrap.dedent(snippet[1]))
    wanted = {"FACTORY_STORE": profile["store"]["uri"], "AWS_ENDPOINT_URL": profile["store"]["endpoint"],
              "AWS_REGION": profile["store"]["region"],
              **{name: {"secretKeyRef": {"name": ref["secret"], "key": ref["key"]}} for name, ref in profile["env_secrets"].items()}}
    return [f"{name}: the values say {env.get(name)!r}, the README's profile {value!r}" for name, value in wanted.items()
            if env.get(name) != value] + [f"{name}: not a setting of the object store" for name in env.keys() - wanted.keys()]


def test_the_values_object_store_block_validates_and_matches_the_readmes_profile():
    vals = values()
    [deployment] = at(vals, "dagster-user-deployments", "deployments")
    deployment["env"] += store_block(VALUES.read_text())
    kubernetes_validate.validate(as_pod("code location", workloads(vals)[f"code location {deployment['name']}"]), KUBERNETES_VERSION, strict=True)
    assert not inlined_credentials(deployment["env"])
    assert store_problems(VALUES.read_text(), README.read_text()) == []


def test_an_object_store_block_that_drifts_from_the_readme_is_found():
    text = VALUES.read_text()
    assert store_problems(text.replace("key: secret-access-key", "key: secret-key"), README.read_text())
    assert store_problems(text.replace("value: eu-west-1", "value: us-east-1"), README.read_text())


def readme_profile(tmp_path: Path) -> ClusterProfile:
    """The README's cluster profile, read as `factory` reads it."""
    path = tmp_path / "cluster.yaml"
    path.write_text(heredocs(README.read_text())["cat > .factory/kind/cluster.yaml"])
    return load_profile(path)


def test_the_readmes_profile_names_what_is_deployed(tmp_path):
    profile = readme_profile(tmp_path)
    kubernetes, claim = profile.kubernetes, the("PersistentVolumeClaim")
    assert kubernetes is not None and kubernetes.storage is not None
    assert kubernetes.namespace == the("Namespace")["metadata"]["name"]
    assert kubernetes.service_account == the("ServiceAccount")["metadata"]["name"]
    assert kubernetes.storage.claim == claim["metadata"]["name"]
    for name, workload in workloads(values()).items():
        store = {v["name"] for v in workload["volumes"] if v.get("persistentVolumeClaim")}
        mounts = [m["mountPath"] for m in workload["container"]["volumeMounts"] if m["name"] in store]
        assert mounts == [kubernetes.storage.mount_path], name
    [deployment] = at(values(), "dagster-user-deployments", "deployments")
    assert deployment["image"]["repository"].startswith(f"{kubernetes.image_registry}/")
    assert set(profile.queues) <= {q["metadata"]["name"] for q in manifests() if q["kind"] == "Queue"}


def test_the_code_location_reads_the_profile_the_readme_puts_in_a_config_map():
    """FACTORY_CLUSTER is the file the README's `kubectl create configmap` holds, where the values mount it."""
    [deployment] = at(values(), "dagster-user-deployments", "deployments")
    env = {e["name"]: e["value"] for e in deployment["env"]}
    [(config_map, mount)] = [(v["configMap"]["name"], m["mountPath"]) for v in deployment["volumes"] if "configMap" in v
                             for m in deployment["volumeMounts"] if m["name"] == v["name"]]
    directory, _, key = env["FACTORY_CLUSTER"].rpartition("/")
    assert directory == mount
    namespace = the("Namespace")["metadata"]["name"]
    assert f"kubectl -n {namespace} create configmap {config_map} --from-file={key}=.factory/kind/cluster.yaml" in README.read_text()


def test_the_code_location_follows_a_git_remote_with_the_key_the_readme_puts_in_a_secret():
    """The sensor fetches FACTORY_GIT_REMOTE's branch with the deploy key and host key of the Secret the README creates,
    mounted where GIT_SSH_COMMAND reads them; the experiments directory is a path inside the repository."""
    [deployment] = at(values(), "dagster-user-deployments", "deployments")
    env = {e["name"]: e["value"] for e in deployment["env"]}
    assert env["FACTORY_GIT_REMOTE"] and env["FACTORY_GIT_BRANCH"] and not env["FACTORY_EXPERIMENTS"].startswith("/")
    [(secret, mount)] = [(v["secret"]["secretName"], m["mountPath"]) for v in deployment["volumes"] if "secret" in v
                         for m in deployment["volumeMounts"] if m["name"] == v["name"]]
    ssh = env["GIT_SSH_COMMAND"]
    key, known = re.search(r"-i (\S+)", ssh).group(1), re.search(r"UserKnownHostsFile=(\S+)", ssh).group(1)
    assert "BatchMode=yes" in ssh and {key.rpartition("/")[0], known.rpartition("/")[0]} == {mount}
    namespace = the("Namespace")["metadata"]["name"]
    command = f"kubectl -n {namespace} create secret generic {secret} --from-file={key.rpartition('/')[2]}="
    assert command in README.read_text() and f"--from-file={known.rpartition('/')[2]}=" in README.read_text()


def test_the_readmes_experiment_passes_the_check_and_the_dry_run(tmp_path):
    """Step 8 on the README's own files, a digest in place of <digest>; the same check refuses a queue the profile lacks."""
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "tiny-code-lm.md").write_text((ROOT / "experiments" / "tiny-code-lm.md").read_text())
    experiment = experiments / "tiny-on-kind.md"
    experiment.write_text(heredocs(README.read_text())["cat > experiments/tiny-on-kind.md"].replace("<digest>", DIGEST))
    profile = readme_profile(tmp_path)
    [report] = check_files([experiment], cluster=profile)
    assert report.errors == []
    jobs = [doc for doc in yaml.safe_load_all(dry_run(load_file(experiment), profile.kubernetes)) if doc]
    assert jobs and {job["spec"]["queue"] for job in jobs} == {"research"}
    assert {job["metadata"]["namespace"] for job in jobs} == {the("Namespace")["metadata"]["name"]}
    store = {"name": "store", "persistentVolumeClaim": {"claimName": the("PersistentVolumeClaim")["metadata"]["name"]}}
    assert all(store in task["template"]["spec"]["volumes"] for job in jobs for task in job["spec"]["tasks"])
    experiment.write_text(experiment.read_text().replace("queue: research", "queue: nowhere"))
    [report] = check_files([experiment], cluster=profile)
    assert report.errors
