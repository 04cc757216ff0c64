"""The data stages on a real Ray cluster (`ray start --head` on 127.0.0.1): with `FACTORY_RAY_ADDRESS` (the cluster
profile's `ray.address`: its Ray Client address, as the deployed profile's, and its GCS address) dedup and the filters
run on Daft's Ray runner, a plugin filter on the cluster's workers, and
they write the tables Daft's native runner writes; a process killed in the middle of a stage fails it with nothing
published, or, a Ray worker, is retried; an address where nothing answers stops `factory run` before any stage, naming the profile's line."""

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from factory.config import UPSTREAM, load, plan_stage
from factory.config.cluster import RAY_ADDRESS_ENV
from factory.data.catalog import CatalogConfig, open_catalog
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


def dies(document):
    """Kills, once, in the middle of the stage: its own process (Daft's process for the filters, in a Ray worker), or with
    KILL_WHAT saying `worker`, the Ray worker too."""
    marker = os.environ["KILLED_MARKER"]
    if "drop me" in document["text"] and not os.path.exists(marker):
        with open(os.path.join(os.path.dirname(marker), "kill-what")) as f:
            worker = f.read() == "worker"
        victim = os.getppid() if worker else os.getpid()
        with open(marker, "w") as f:
            f.write(str(victim))
        os.kill(victim, 9)  # SIGKILL, as the OOM killer sends it
        os.kill(os.getpid(), 9)
    return True

DIES_ONCE = DocumentFilter(name="dies_once", keep=dies, description="kills the process judging it, or its Ray worker, once")
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
    return fake_package(tmp_path_factory.mktemp("ray-site"), "judged_on_ray", JUDGED_ON_RAY,
                        {"on_ray": "judged_on_ray:ON_RAY", "dies_once": "judged_on_ray:DIES_ONCE"}, group="model_factory.filters")


@pytest.fixture(scope="module")
def cluster(site, tmp_path_factory) -> Iterator[dict]:
    """One Ray cluster for the module, its processes with the plugins on their path; where its filters write."""
    marks = tmp_path_factory.mktemp("ray-marks")
    plugins = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    with running_ray({**plugins, "WHERE_IT_RAN": str(marks / "ray-pids"), "KILLED_MARKER": str(marks / "killed")}) as (address, client, token):
        yield {"address": address, "client": client, "token": token, "plugins": plugins, "marks": marks}


def run_stages(tmp_path: Path, tiny_path: Path, label: str, env: dict[str, str] | None = None, dataset: dict | None = None,
               remote: tuple[str, ...] = ("deduped_datasets", "filtered_datasets"), last_exit: int = 0) -> str:
    """raw -> dedup -> filtered over FILES (`dataset`: its settings, default DATASET), against a registry and catalog of
    `label`'s own: in this process, or (with `env`) the `remote` kinds in a process of their own with `env`, as the
    launcher starts a stage; the last one exits `last_exit`. What the processes of their own said."""
    source = tmp_path / "source"
    if not source.exists():
        source.mkdir()
        for name, text in FILES.items():
            (source / name).write_text(text)
    tiny = load(tiny_path)
    experiment = tiny.model_copy(update={"data": tiny.data.model_validate(
        {"datasets": {"code": {"source": {"kind": "directory", "path": str(source)}, **(dataset or DATASET)}}})})
    registry, digests, said = ArtifactStore(tmp_path / label / "registry"), {}, ""
    kinds = list(UPSTREAM)[: list(UPSTREAM).index("filtered_datasets") + 1]
    for kind in kinds:
        spec = plan_stage(experiment, kind, digests)
        request = StageRequest(spec=spec, registry=str(registry.root), catalog=CatalogConfig.local(tmp_path / label / "catalog"),
                               provenance=Provenance(experiment="tiny-code-lm", config_hash="0" * 16, git_commit="test"))
        path = request.write(tmp_path / f"{label}-{kind}.json")
        if env is None or kind not in remote:
            assert main([str(path)]) == (last_exit if kind == kinds[-1] else 0), kind
        else:
            done = subprocess.run([sys.executable, "-m", "factory.runtime", str(path)], capture_output=True, text=True, timeout=600,
                                  env={**os.environ, **env})
            assert done.returncode == (last_exit if kind == kinds[-1] else 0), done.stdout[-3000:] + done.stderr[-3000:]
            said += done.stdout + done.stderr
        if (manifest := registry.lookup(spec.fingerprint)) is not None:
            digests[kind] = manifest.digest
    return said


def tables(root: Path) -> dict[str, dict]:
    """What each data stage wrote, by kind: its datasets.json (the versions' content tags and counts)."""
    registry = ArtifactStore(root / "registry")
    return {manifest.kind: json.loads((registry.path(manifest.digest) / DATASETS_FILE).read_text()) for manifest in registry.manifests()}


def test_the_data_stages_run_on_a_ray_cluster_and_write_what_the_native_runner_writes(tmp_path, tiny_path, site, cluster, monkeypatch):
    """Through Ray Client (`ray://`), as the deployed profile reaches the cluster from a stage's pod: near dedup's
    signatures wait on the cluster as Daft's partitions, which Ray Client can run (a Ray dataset of them cannot)."""
    monkeypatch.setenv("PYTHONPATH", cluster["plugins"]["PYTHONPATH"])
    monkeypatch.setenv("WHERE_IT_RAN", str(tmp_path / "native-pids"))
    address = cluster["client"]
    with installed(site):
        run_stages(tmp_path, tiny_path, "native")
        said = run_stages(tmp_path, tiny_path, "ray", {RAY_ADDRESS_ENV: address, **cluster["token"], "WHERE_IT_RAN": str(tmp_path / "driver-pids")})

    assert f"data engine: Daft's Ray runner on the Ray cluster at {address} (2 CPUs)" in said

    written, native = tables(tmp_path / "ray"), tables(tmp_path / "native")
    assert set(written) == {"raw_datasets", "deduped_datasets", "filtered_datasets"}
    assert written == native  # the same content tags and counts: the engine changes where, never what
    dedup = written["deduped_datasets"]["code"]
    assert dedup["exact_removed"] == 1 and dedup["near_removed"] >= 2
    assert written["filtered_datasets"]["code"]["removed_on_ray"] == 1
    # The cluster's processes (and theirs) have the environment `ray start` had; the stage's own, and its children, another.
    judged = written["filtered_datasets"]["code"]["rows_in"]
    assert len((cluster["marks"] / "ray-pids").read_text().split()) == judged  # each document the filter saw: on the cluster
    assert not (tmp_path / "driver-pids").exists()  # none in the stage's own process or one it started
    assert len((tmp_path / "native-pids").read_text().split()) == judged  # natively: in Daft's processes, here


NEAR_ON_RAY = """
import json, logging, sys
import pyarrow as pa
from factory.config.cluster import RAY_ADDRESS_ENV
from factory.config.data_sections import DedupConfig
from factory.data import minhash
from factory.data.engine import use_engine

use_engine(logging.getLogger("test"), {RAY_ADDRESS_ENV: sys.argv[1]})
minhash.SPILL_ROWS = 3  # a partition on the cluster every three signatures
texts = json.loads(sys.argv[2])
documents = pa.table({"id": sorted(texts), "text": [texts[name] for name in sorted(texts)]})
print(json.dumps(sorted(minhash.near_duplicates(documents, DedupConfig.model_validate(json.loads(sys.argv[3])), 0, chunk=2, at_once=4))))
"""


def test_near_dedup_through_ray_client_signs_chunks_at_once_and_groups_many_partitions_as_the_native_runner(cluster):
    """Many chunks signed at once (Daft's plan runner started before the threads ask for it) and many partitions of
    signatures on the cluster, through Ray Client: the documents the native runner removes."""
    from factory.config.data_sections import DedupConfig
    from factory.data.minhash import near_duplicates

    config = {"exact": False, "near_threshold": 0.5, "num_perm": 32}
    documents = {"id": sorted(FILES), "text": [FILES[name] for name in sorted(FILES)]}
    native = sorted(near_duplicates(pa.table(documents), DedupConfig.model_validate(config), 0))
    done = subprocess.run([sys.executable, "-c", NEAR_ON_RAY, cluster["client"], json.dumps(FILES), json.dumps(config)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **cluster["token"]})
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == native and len(native) >= 3  # the near copies but the first


def test_a_process_killed_in_the_middle_of_a_stage_fails_it_publishing_nothing_and_a_killed_ray_worker_is_retried(
        tmp_path, tiny_path, site, cluster, monkeypatch, capfd):
    """A plugin filter SIGKILLs, once, the process judging one document: Daft's process for the filters (here, on the
    native runner) fails the stage saying so, with neither its artifact nor a version of its table published; a Ray
    worker is retried by Ray, and the table is whole, at the version the failed attempt did not take."""
    monkeypatch.setenv("PYTHONPATH", cluster["plugins"]["PYTHONPATH"])
    dying = {**DATASET, "filters": {"min_bytes": 1, "custom": ["dies_once"]}}
    marker, what = cluster["marks"] / "killed", cluster["marks"] / "kill-what"
    with installed(site):
        monkeypatch.setenv("KILLED_MARKER", str(marker))
        what.write_text("process")
        run_stages(tmp_path, tiny_path, "killed", dataset=dying, last_exit=1)
        said = capfd.readouterr().err
        assert "a worker process of the plugin filters dies_once died mid-batch (killed: out of memory, or by a signal)" in said, said
        assert "nothing was published" in said, said
        assert "Traceback" not in said and marker.exists()
        assert set(tables(tmp_path / "killed")) == {"raw_datasets", "deduped_datasets"}
        catalog = open_catalog(CatalogConfig.local(tmp_path / "killed" / "catalog"))
        assert not catalog.table_exists("filtered.code") or catalog.load_table("filtered.code").current_snapshot() is None

        marker.unlink()
        what.write_text("worker")
        env = {RAY_ADDRESS_ENV: cluster["address"], **cluster["token"], "KILLED_MARKER": str(tmp_path / "not-on-the-cluster")}
        said = run_stages(tmp_path, tiny_path, "killed", env, dataset=dying, remote=("filtered_datasets",))
    assert f"Worker PID: {int(marker.read_text())}" in said  # Ray saw its worker die: the one the filter killed
    assert not (tmp_path / "not-on-the-cluster").exists()  # nothing was judged in the stage's own process
    written = tables(tmp_path / "killed")
    filtered, deduped = written["filtered_datasets"]["code"], written["deduped_datasets"]["code"]
    assert filtered["rows_out"] == deduped["rows_out"] > 0 and filtered["content_tag"] == deduped["content_tag"]
    assert filtered["tag"] == "v1"  # the failed attempt took no version


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
