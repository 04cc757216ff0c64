"""Cluster profiles: placements checked against queues, `image: local` only with the local launcher, errors with file:line."""

from pathlib import Path

import pytest

from factory.config.cluster import load_profile
from factory.errors import ConfigError
from factory.preflight import check_files
from tests.forked import factory_command

PROFILE = """\
launcher: volcano
queues:
  default: {nodes: 4, gpus_per_node: 8, priorities: [normal, high]}
  cpu: {nodes: 16}
"""
PINNED = "trainer@sha256:" + "a" * 64


def write(tmp_path, name, text) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def experiment(tmp_path, resources: str, image: str = PINNED) -> Path:
    return write(tmp_path, "exp.md", f"---\nimage: {image}\npretrain: {{steps: 10}}\nresources:\n{resources}---\nwhy\n")


def test_a_placement_that_fits_passes(tmp_path):
    profile = load_profile(write(tmp_path, "cluster.yaml", PROFILE))
    path = experiment(tmp_path, "  nodes: 4\n  gpus: 8\n  priority: high\n")
    [report] = check_files([path], cluster=profile)
    assert report.ok, report.errors


def test_what_does_not_fit_is_named_with_file_line_and_what_the_queue_has(tmp_path):
    profile = load_profile(write(tmp_path, "cluster.yaml", PROFILE))
    path = experiment(tmp_path, "  nodes: 8\n  gpus: 16\n  priority: urgent\n")
    [report] = check_files([path], cluster=profile)
    assert report.errors == [
        f"{path}:5: resources.nodes: 8 nodes, but queue 'default' gives a stage at most 4",
        f"{path}:6: resources.gpus: 16 GPUs per node, but queue 'default' has 8",
        f"{path}:7: resources.priority: priority 'urgent' is not offered by queue 'default'; offered: normal, high",
    ]
    path = experiment(tmp_path, "  queue: gpu-large\n")
    [report] = check_files([path], cluster=profile)
    assert report.errors == [f"{path}:5: resources.queue: unknown queue 'gpu-large'; the cluster has: cpu, default"]


def test_image_local_runs_only_with_the_local_launcher(tmp_path):
    path = experiment(tmp_path, "  queue: cpu\n", image="local")
    [report] = check_files([path], cluster=load_profile(write(tmp_path, "cluster.yaml", PROFILE)))
    assert report.errors == [f"{path}:2: image: 'local' runs only with the local launcher; the volcano launcher needs an image pinned "
                             "by digest (name@sha256:<64 hex>)"]
    local = load_profile(write(tmp_path, "local.yaml", PROFILE.replace("volcano", "local")))
    [report] = check_files([path], cluster=local)
    assert report.ok, report.errors
    [report] = check_files([experiment(tmp_path, "  queue: cpu\n  nodes: 2\n", image="local")], cluster=local)
    assert report.errors[0].endswith("resources.nodes: 2 nodes, but the local launcher runs a stage on one machine")


def test_without_a_profile_placement_is_not_judged(tmp_path):
    [report] = check_files([experiment(tmp_path, "  nodes: 64\n  queue: anything\n", image="local")])
    assert report.ok, report.errors


@pytest.mark.parametrize(("text", "message"), [
    ("launcher: slurm\nqueues: {default: {nodes: 1}}\n", ":1: launcher: Input should be 'local' or 'volcano' (found 'slurm')"),
    ("queues:\n  default: {nodes: 1, gpu: 1}\n", ":2: queues.default.gpu: unknown key; allowed here: gpus_per_node, nodes, priorities"),
    ("queues: {}\n", ":1: queues: "),
    ("queues: [\n", ": invalid YAML"),
    ("queues: {default: {nodes: 1}}\nray:\n  address: http://head:8265\n", ":3: ray.address: "),
    ("queues: {default: {nodes: 1}}\nray: {adress: 'head:6379'}\n", ":2: ray.adress: unknown key; allowed here: address"),
])
def test_a_bad_profile_is_a_config_error_with_file_line(tmp_path, text, message):
    path = write(tmp_path, "cluster.yaml", text)
    with pytest.raises(ConfigError) as failed:
        load_profile(path)
    assert message in str(failed.value) and str(path) in str(failed.value)


def test_the_cli_takes_the_profile_and_exits_2(tmp_path):
    path = experiment(tmp_path, "  nodes: 8\n")
    profile = write(tmp_path, "cluster.yaml", PROFILE)
    run = ["check", str(path), "--root", str(tmp_path / "root")]
    done = factory_command(*run, "--cluster", str(profile))
    assert done.returncode == 2 and "resources.nodes: 8 nodes" in done.stderr
    missing = factory_command(*run, "--cluster", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "cannot read the cluster profile" in missing.stderr and "Traceback" not in missing.stderr


@pytest.mark.parametrize(("evaluations", "error"), [
    ("{queue: gpu}", ":6: kubernetes.evaluations.queue: unknown queue 'gpu'; the cluster has: cpu, default"),
    ("{queue: cpu, gpus: 1}", ":6: kubernetes.evaluations.gpus: 1 GPUs per node, but queue 'cpu' has 0"),
    ("{queue: default, priority: low}", ":6: kubernetes.evaluations.priority: priority 'low' is not offered by queue 'default'"),
])
def test_where_evaluation_batches_run_is_checked_against_the_queues(tmp_path, evaluations, error):
    text = PROFILE + f"kubernetes:\n  evaluations: {evaluations}\n"
    with pytest.raises(ConfigError) as caught:
        load_profile(write(tmp_path, "cluster.yaml", text))
    assert str(caught.value).startswith(f"{tmp_path / 'cluster.yaml'}{error}")
    fits = PROFILE + "kubernetes:\n  evaluations: {queue: default, gpus: 8, priority: high}\n"
    assert load_profile(write(tmp_path, "fits.yaml", fits)).kubernetes.evaluations.gpus == 8
