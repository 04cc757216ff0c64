"""The data stages on a real Ray cluster (`ray start --head` on 127.0.0.1): with `FACTORY_RAY_ADDRESS` (the cluster
profile's `ray.address`) dedup and the filters run on Daft's Ray runner, a plugin filter on the cluster's workers, and
they write the tables Daft's native runner writes; an address where nothing answers stops `factory run` before any
stage, naming the profile's line."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from factory.config import UPSTREAM, load, plan_stage
from factory.config.cluster import RAY_ADDRESS_ENV
from factory.data.catalog import CatalogConfig
from factory.data.engine import use_engine
from factory.errors import StageFailed
from factory.registry.layout import DATASETS_FILE
from factory.registry.store import ArtifactStore, Provenance
from factory.runtime.__main__ import main
from factory.runtime.request import StageRequest
from tests.plugins.conftest import fake_package, installed
from tests.raycluster import running_ray
from tests.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_pipes")]

JUDGED_ON_RAY = '''
import os
from factory.plugin import DocumentFilter

def keep(document):
    with open(os.environ["WHERE_IT_RAN"], "a") as f:  # each process writes where its environment says
        f.write(f"{os.getpid()}\\n")
    return "drop me" not in document["text"]

ON_RAY = DocumentFilter(name="on_ray", keep=keep, description="records the process it ran in")
'''
SHARED = "".join(f"value_{i} = compute({i}, twice=True)\n" for i in range(30))
FILES = {
    **{f"near{n}.py": SHARED + f"last = {n}\n" for n in range(4)},  # near duplicates of each other
    "exact_a.py": "x = 1\n" * 20, "exact_b.py": "x = 1\n" * 20,  # exact duplicates
    "dropped.py": "# drop me\n" + "y = 2\n" * 20,  # the plugin filter's
    **{f"other{n}.py": f"def other_{n}():\n    return {n}\n" * (n + 3) for n in range(5)},
}
DATASET = {"dedup": {"exact": True, "near_threshold": 0.5, "num_perm": 32}, "filters": {"min_bytes": 1, "custom": ["on_ray"]}}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return fake_package(tmp_path_factory.mktemp("ray-site"), "judged_on_ray", JUDGED_ON_RAY, {"on_ray": "judged_on_ray:ON_RAY"},
                        group="model_factory.filters")


def run_stages(tmp_path: Path, tiny_path: Path, label: str, env: dict[str, str] | None = None) -> str:
    """raw -> dedup -> filtered over FILES, against a registry and catalog of `label`'s own: in this process, or (with `env`)
    dedup and filtered in a process of their own with `env`, as the launcher starts a stage. What that process said."""
    source = tmp_path / "source"
    if not source.exists():
        source.mkdir()
        for name, text in FILES.items():
            (source / name).write_text(text)
    tiny = load(tiny_path)
    experiment = tiny.model_copy(update={"data": tiny.data.model_validate(
        {"datasets": {"code": {"source": {"kind": "directory", "path": str(source)}, **DATASET}}})})
    registry, digests, said = ArtifactStore(tmp_path / label / "registry"), {}, ""
    for kind in list(UPSTREAM)[: list(UPSTREAM).index("filtered_datasets") + 1]:
        spec = plan_stage(experiment, kind, digests)
        request = StageRequest(spec=spec, registry=str(registry.root), catalog=CatalogConfig.local(tmp_path / label / "catalog"),
                               provenance=Provenance(experiment="tiny-code-lm", config_hash="0" * 16, git_commit="test"))
        path = request.write(tmp_path / f"{label}-{kind}.json")
        if env is None or kind == "raw_datasets":
            assert main([str(path)]) == 0, kind
        else:
            done = subprocess.run([sys.executable, "-m", "factory.runtime", str(path)], capture_output=True, text=True, timeout=600,
                                  env={**os.environ, **env})
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            said += done.stdout + done.stderr
        digests[kind] = registry.lookup(spec.fingerprint).digest
    return said


def tables(root: Path) -> dict[str, dict]:
    """What each data stage wrote, by kind: its datasets.json (the versions' content tags and counts)."""
    registry = ArtifactStore(root / "registry")
    return {manifest.kind: json.loads((registry.path(manifest.digest) / DATASETS_FILE).read_text()) for manifest in registry.manifests()}


def test_the_data_stages_run_on_a_ray_cluster_and_write_what_the_native_runner_writes(tmp_path, tiny_path, site, monkeypatch):
    plugins = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    monkeypatch.setenv("PYTHONPATH", plugins["PYTHONPATH"])
    monkeypatch.setenv("WHERE_IT_RAN", str(tmp_path / "native-pids"))
    with installed(site):
        run_stages(tmp_path, tiny_path, "native")
        with running_ray({**plugins, "WHERE_IT_RAN": str(tmp_path / "ray-pids")}) as (address, token):
            said = run_stages(tmp_path, tiny_path, "ray", {RAY_ADDRESS_ENV: address, **token, "WHERE_IT_RAN": str(tmp_path / "driver-pids")})

    assert f"data engine: Daft's Ray runner on the Ray cluster at {address} (2 CPUs)" in said

    written, native = tables(tmp_path / "ray"), tables(tmp_path / "native")
    assert set(written) == {"raw_datasets", "deduped_datasets", "filtered_datasets"}
    assert written == native  # the same content tags and counts: the engine changes where, never what
    dedup = written["deduped_datasets"]["code"]
    assert dedup["exact_removed"] == 1 and dedup["near_removed"] >= 2
    assert written["filtered_datasets"]["code"]["removed_on_ray"] == 1
    # The cluster's processes (and theirs) have the environment `ray start` had; the stage's own, and its children, another.
    judged = written["filtered_datasets"]["code"]["rows_in"]
    assert len((tmp_path / "ray-pids").read_text().split()) == judged  # each document the filter saw: on the cluster
    assert not (tmp_path / "driver-pids").exists()  # none in the stage's own process or one it started
    assert len((tmp_path / "native-pids").read_text().split()) == judged  # natively: in Daft's processes, here


def test_a_ray_address_where_nothing_answers_fails_the_stage_saying_where_it_was_told_to_go():
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(StageFailed, match=rf"no Ray cluster answers at {address} \({RAY_ADDRESS_ENV}, the cluster profile's ray.address\)"):
        use_engine(logging.getLogger("test"), {RAY_ADDRESS_ENV: address})


def test_factory_run_refuses_an_unreachable_ray_cluster_at_the_profiles_line_before_any_stage(tmp_path, tiny_path):
    profile = tmp_path / "cluster.yaml"
    port = free_port()
    profile.write_text(f"launcher: local\nqueues:\n  cpu: {{nodes: 1}}\nray:\n  address: 127.0.0.1:{port}\n")
    root = tmp_path / "root"
    done = subprocess.run([sys.executable, "-m", "factory", "run", str(tiny_path), "--root", str(root), "--cluster", str(profile)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "FACTORY_TRACKER": "none"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{profile}:5: ray.address: no Ray cluster answers at 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr and not (root / "registry").exists()
