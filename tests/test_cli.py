"""The `factory` command: bad input is a clear message and exit 2, never a traceback."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from factory.registry import ArtifactStore
from tests.conftest import publish_model, publish_result
from tests.forked import factory_command


def factory(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m factory ARGS` in a process of its own, forked from one that imported the command line (tests/forked.py)."""
    return factory_command(*args, cwd=cwd)


def broken_copy(tiny_path: Path, tmp_path: Path) -> tuple[Path, int]:
    """tiny-code-lm with `steps:` set to a word; returns the file and the line of that key."""
    lines = tiny_path.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if line.strip().startswith("steps:"))
    lines[index] = "  steps: many"
    path = tmp_path / "broken.md"
    path.write_text("\n".join(lines) + "\n")
    return path, index + 1


def test_check_accepts_the_shipped_experiments(tiny_path):
    result = factory("check", str(tiny_path.parent))
    assert result.returncode == 0, result.stderr
    assert "tiny-code-lm" in result.stdout


def test_check_names_file_line_and_field(tiny_path, tmp_path):
    path, line = broken_copy(tiny_path, tmp_path)
    result = factory("check", str(path))
    assert result.returncode == 2
    assert f"{path}:{line}: pretrain.steps:" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_run_rejects_a_bad_file_before_starting_dagster(tiny_path, tmp_path):
    path, line = broken_copy(tiny_path, tmp_path)
    result = factory("run", str(path), "--root", str(tmp_path / "state"))
    assert result.returncode == 2
    assert f"{path}:{line}: pretrain.steps:" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "state").exists()


def test_run_of_a_missing_file_says_so(tmp_path):
    result = factory("run", str(tmp_path / "nope.md"), "--root", str(tmp_path / "state"))
    assert result.returncode == 2
    assert "no such experiment file" in result.stderr and "Traceback" not in result.stderr


def test_leaderboard_without_runs_says_what_to_do(tmp_path):
    result = factory("leaderboard", "--root", str(tmp_path))
    assert result.returncode == 1
    assert f"run `factory run 'experiments/<name>.md' --root {tmp_path.resolve()}` first" in result.stderr
    assert "Traceback" not in result.stderr


def test_evals_list_shows_the_shipped_benchmarks_and_takes_the_common_options(tmp_path):
    result = factory("evals", "list", "--root", str(tmp_path))
    assert result.returncode == 0 and all(name in result.stdout for name in ("val_bpb", "heldout_bpb", "next_line", "python_sanity"))


def git_repository(path: Path) -> Path:
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run([*git, "init", "-q"], cwd=path, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "empty"], cwd=path, check=True)
    return path


def test_plan_from_another_directory_uses_the_root_of_the_experiments_repository(tmp_path):
    repo, elsewhere = git_repository(tmp_path / "repo"), tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = small_experiment(repo)
    [raw] = [stage for stage in json.loads(factory("plan", str(path), "--json", cwd=repo).stdout)["stages"] if stage["kind"] == "raw_datasets"]
    publish_files(ArtifactStore(repo / ".factory" / "registry"), raw["fingerprint"], {"a.txt": b"a"}, kind="raw_datasets")
    plan = factory("plan", str(path), "--json", cwd=elsewhere)
    assert plan.returncode == 0, plan.stderr
    assert {s["kind"]: s["status"] for s in json.loads(plan.stdout)["stages"]}["raw_datasets"] == "cached"
    assert not (elsewhere / ".factory").exists()
    (repo / "factory.toml").write_text('root = "state"\n')  # the repository's settings name another root: nothing is cached there
    moved = json.loads(factory("plan", str(path), "--json", cwd=elsewhere).stdout)
    assert {s["kind"]: s["status"] for s in moved["stages"]}["raw_datasets"] == "run"


def test_a_bad_settings_file_is_exit_2_with_its_line(tiny_path, tmp_path):
    repo = git_repository(tmp_path / "repo")
    (repo / "factory.toml").write_text('root = ".factory"\n[pools]\ntrainig = 2\n')
    shutil.copy(tiny_path, repo / "tiny.md")
    for args in (("check", str(repo / "tiny.md")), ("leaderboard",), ("evals", "list")):
        result = factory(*args, cwd=repo)
        assert result.returncode == 2, (args, result.stderr)
        assert f"{repo / 'factory.toml'}:3: pools.trainig: unknown pool" in result.stderr and "Traceback" not in result.stderr


def test_evals_compare_passes_only_on_the_required_improvement(tmp_path):
    registry = ArtifactStore(tmp_path / "registry")
    publish_result(registry, "big", "val_bpb", 1.9)
    publish_result(registry, "small", "val_bpb", 2.0)
    on = ("--benchmark", "val_bpb", "--root", str(tmp_path))  # both of the same blend: their own held-out splits are the same data
    enough = factory("evals", "compare", "big", "small", "--min-improvement", "0.04", *on)
    assert enough.returncode == 0 and "+5.0%" in enough.stdout
    short = factory("evals", "compare", "big", "small", "--min-improvement", "0.06", *on)
    assert short.returncode == 1 and "NOT better enough" in short.stdout
    missing = factory("evals", "compare", "big", "nope", *on)
    assert missing.returncode == 2 and "no val_bpb results for nope" in missing.stderr


def test_evals_compare_refuses_scores_measured_on_other_data(tmp_path):
    registry = ArtifactStore(tmp_path / "registry")
    for experiment, blend, own, shared in (("nightly", "c" * 64, 2.0, 2.0), ("tiny", "d" * 64, 1.5, 2.2)):
        publish_result(registry, experiment, "val_bpb", own, blend=blend)
        publish_result(registry, experiment, "heldout_bpb", shared, blend=blend)
    refused = factory("evals", "compare", "nightly", "tiny", "--benchmark", "val_bpb", "--root", str(tmp_path))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "nightly and tiny have val_bpb scores that do not compare: nightly's on its own held-out split (blend cccccccc…)" \
           in refused.stderr and "tiny's on its own held-out split (blend dddddddd…)" in refused.stderr
    compared = factory("evals", "compare", "nightly", "tiny", "--min-improvement", "0.05", "--root", str(tmp_path))  # heldout_bpb
    assert compared.returncode == 0, compared.stderr
    assert compared.stdout.startswith("nightly heldout_bpb 2.0000 vs tiny 2.2000: +9.1%")


def test_evals_stages_shows_what_each_training_stage_bought(tmp_path):
    registry = ArtifactStore(tmp_path / "registry")
    for stage, training, scores in (("pretrain", "p", (0.0, 0.0)), ("sft", "s", (0.1, 0.14)), ("rl", "r", (0.15, 0.13))):
        for step, value in zip((10, 20), scores, strict=True):
            publish_result(registry, "post", "code_exec", value, step=step, training=training, stage=stage)
    shown = factory("evals", "stages", "post", "--benchmark", "code_exec", "--must-improve", "sft", "--root", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stdout.splitlines() if "post__" in line]
    assert ["pretrain-000020" in lines[0], "sft-000020" in lines[1], "rl-000020" in lines[2]] == [True] * 3  # last checkpoints
    assert "+0.1400" in lines[1] and "-0.0100" in lines[2]
    worse = factory("evals", "stages", "post", "--benchmark", "code_exec", "--must-improve", "rl", "--root", str(tmp_path))
    assert worse.returncode == 1 and "rl did not improve on sft" in worse.stderr
    none = factory("evals", "stages", "nope", "--root", str(tmp_path))
    assert none.returncode == 2 and "no code_exec results for nope" in none.stderr
    for step, value in ((0, 0.05), (40, 0.05)):  # an imported model fine-tuned with checkpoint_at_start: its step 0 is the start
        publish_result(registry, "tuned", "code_exec", value, step=step, training="t", stage="sft")
    started = factory("evals", "stages", "tuned", "--benchmark", "code_exec", "--must-improve", "sft", "--root", str(tmp_path))
    rows = [line for line in started.stdout.splitlines() if "tuned__" in line]
    assert "sft (start)" in rows[0] and "sft-000000" in rows[0] and "sft-000040" in rows[1] and "+0.0000" in rows[1]
    assert started.returncode == 1 and "sft did not improve on sft (start)" in started.stderr


def test_leaderboard_json_and_html_from_the_registry(tmp_path):
    registry = ArtifactStore(tmp_path / "registry")
    publish_result(registry, "a", "val_bpb", 2.0)
    publish_result(registry, "b", "val_bpb", 1.5)
    model = publish_model(registry, "a")  # a and b share their training run: one model
    publish_result(registry, "cut", "val_bpb", 1.0, training="run-cut")  # interrupted: no model
    page = tmp_path / "board.html"
    result = factory("leaderboard", "--root", str(tmp_path), "--json", "--html", str(page))
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["rows"]
    assert [(row["experiment"], row["ranked"], row["model"]) for row in rows] == [("b", True, model), ("a", True, model), ("cut", False, "")]
    assert page.read_text().startswith("<!doctype html>")
    table = factory("leaderboard", "--root", str(tmp_path), "--benchmark", "val_bpb")
    assert table.returncode == 0 and "ranked by val_bpb" in table.stdout
    assert model[:12] in table.stdout and "unfinished" in table.stdout
    bad = factory("leaderboard", "--root", str(tmp_path), "--benchmark", "nope")
    assert bad.returncode == 2 and "no results for benchmark 'nope'" in bad.stderr


def extending(tmp_path: Path, tiny_path: Path, body: str) -> tuple[Path, int]:
    """A file that extends the tiny experiment with `body` (YAML); returns it and the line of body's last key."""
    (tmp_path / "tiny-code-lm.md").write_text(tiny_path.read_text())
    path = tmp_path / "mine.md"
    path.write_text(f"---\nextends: tiny-code-lm.md\n{body}\n---\n")
    return path, 2 + body.count("\n") + 1


def test_run_refuses_an_unknown_benchmark_before_any_compute(tiny_path, tmp_path):
    path, line = extending(tmp_path, tiny_path, "eval:\n  benchmarks: [val_bpb, no_such_benchmark]")
    result = factory("run", str(path), "--root", str(tmp_path / "state"))
    assert result.returncode == 2, result.stderr
    assert f"{path}:{line}: eval.benchmarks: unknown benchmark 'no_such_benchmark'" in result.stderr
    assert "nothing ran" in result.stderr and "Traceback" not in result.stderr
    assert f"(`factory check {path} --root {(tmp_path / 'state').resolve()}` checks it again)" in result.stderr  # the hint keeps --root
    assert not (tmp_path / "state" / "registry").exists()


def test_run_refuses_a_missing_source_directory_with_its_line(tiny_path, tmp_path):
    body = "data:\n  datasets:\n    notes:\n      source: {kind: directory, path: nowhere}\n  blend:\n    - {dataset: notes}"
    path, _ = extending(tmp_path, tiny_path, body)
    result = factory("run", str(path), "--root", str(tmp_path / "state"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"{path}:6: data.datasets.notes.source.path: 'nowhere' is not a directory here" in result.stderr
    assert not (tmp_path / "state" / "registry").exists()


def test_check_refuses_a_pinned_task_table_without_the_columns_post_training_reads(tiny_path, tmp_path):
    import logging

    import pyarrow as pa

    from factory.data.catalog import CatalogConfig, open_catalog
    from factory.data.tables import write_version

    rows = pa.table({"id": ["a"], "sha256": ["0" * 64], "bytes": [1], "question": ["?"]})
    write_version(open_catalog(CatalogConfig.at(tmp_path / "state")), "post.chat", rows, logging.getLogger("test"), tag="v1", schema=rows.schema)
    path, line = extending(tmp_path, tiny_path, "sft:\n  steps: 2\n  tasks: post.chat@v1")
    result = factory("check", str(path), "--root", str(tmp_path / "state"))
    assert result.returncode == 2, result.stderr
    assert f"{path}:{line}: sft.tasks: post.chat@v1 has no column 'function', 'call', 'expected', 'split'" in result.stderr


def test_check_warns_of_a_blend_part_of_weight_zero_and_an_unblended_dataset(tiny_path, tmp_path):
    body = ("data:\n  datasets:\n    spare:\n      source: {kind: python-stdlib, include: ['json/*.py']}\n"
            "  blend:\n    - {dataset: stdlib, weight: 3}\n    - {dataset: site_packages, weight: 0}")
    path, line = extending(tmp_path, tiny_path, body)
    result = factory("check", str(path))
    assert result.returncode == 0, result.stderr
    assert f"warning: {path}:{line}: data.blend.1.weight: weight 0: dataset 'site_packages' is still ingested" in result.stderr
    assert f"warning: {path}:5: data.datasets.spare: dataset 'spare' is not in data.blend: no stage reads it" in result.stderr


def test_strict_run_refuses_an_untracked_experiment_file(tiny_path, tmp_path):
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "empty"], cwd=tmp_path, check=True)
    path, _ = extending(tmp_path, tiny_path, "seed: 7")
    result = factory("run", str(path), "--strict", "--root", str(tmp_path / "state"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"{path} is untracked; commit it (or drop --strict)" in result.stderr
    assert not (tmp_path / "state" / "registry").exists()


def sweep_file(tiny_path: Path, tmp_path: Path) -> Path:
    """A two-variant sweep over tiny-code-lm's learning rate: mine.lr=0.001 and mine.lr=0.003."""
    return extending(tmp_path, tiny_path, "sweep:\n  pretrain.lr: [0.001, 0.003]")[0]


def test_plan_shows_where_each_training_stage_runs_and_how_its_ranks_share_the_model(tiny_path, tmp_path):
    body = "pretrain:\n  parallelism: fsdp\n  checkpoint_format: sharded\n  activation_checkpointing: selective\nresources:\n  processes_per_node: 2"
    path = extending(tmp_path, tiny_path, body)[0]
    shown = subprocess.run([sys.executable, "-m", "factory", "plan", str(path), "--root", str(tmp_path / "state")], capture_output=True,
                           text=True, timeout=120, env={**os.environ, "COLUMNS": "250"})
    assert shown.returncode == 0, shown.stderr
    [row] = [line for line in shown.stdout.splitlines() if "│ pretrain " in line]
    assert "1 node × 2 processes, cpu, fsdp, activation checkpointing selective" in row
    assert not any("node" in line for line in shown.stdout.splitlines() if "│ tokenizer " in line), "a data stage has no ranks"
    plan = json.loads(factory("plan", str(tiny_path), "--root", str(tmp_path / "state"), "--json").stdout)
    assert {s["kind"]: s["placement"] for s in plan["stages"]}["pretrain"] == {"nodes": 1, "processes": 1, "device": "cpu", "parallelism": "ddp"}


def test_data_batch_of_a_sweep_takes_a_variant_by_name(tiny_path, tmp_path):
    sweep, root = sweep_file(tiny_path, tmp_path), str(tmp_path / "state")
    unnamed = factory("data", "batch", str(sweep), "0", "--root", root)
    assert unnamed.returncode == 2, unnamed.stderr
    assert "pick one with --variant NAME: mine.lr=0.001, mine.lr=0.003" in unnamed.stderr and "load_file" not in unnamed.stderr
    unknown = factory("data", "batch", str(sweep), "0", "--root", root, "--variant", "mine.lr=0.1")
    assert unknown.returncode == 2 and "has no variant 'mine.lr=0.1'; its variants: mine.lr=0.001, mine.lr=0.003" in unknown.stderr
    chosen = factory("data", "batch", str(sweep), "0", "--root", root, "--variant", "mine.lr=0.003")
    assert chosen.returncode == 1, chosen.stderr  # the variant is picked; it has not run, so there is no batch to fetch yet
    assert "mine.lr=0.003 has no published raw_datasets artifact" in chosen.stderr and "Traceback" not in chosen.stderr


def test_diff_compares_variants_of_sweep_files(tiny_path, tmp_path):
    sweep, root = str(sweep_file(tiny_path, tmp_path)), str(tmp_path / "state")
    two = factory("diff", sweep, sweep, "--variant", "mine.lr=0.001", "--variant", "mine.lr=0.003", "--root", root)
    assert two.returncode == 0, two.stderr
    assert "config: pretrain.lr: 0.001 -> 0.003" in two.stdout and "pretrain: differs" in two.stdout
    against_plain = factory("diff", sweep, str(tiny_path), "--variant", "mine.lr=0.003", "--root", root)
    assert against_plain.returncode == 0, against_plain.stderr
    assert "config: identical recipes" in against_plain.stdout and "tokenizer: same stage" in against_plain.stdout
    unknown = factory("diff", sweep, str(tiny_path), "--variant", "lr=0.003", "--root", root)
    assert unknown.returncode == 2 and "has no variant 'lr=0.003'; its variants: mine.lr=0.001, mine.lr=0.003" in unknown.stderr


def test_diff_of_a_from_file_prints_only_what_differs_and_all_prints_the_rest(tmp_path):
    (tmp_path / "base.md").write_text("---\nmodel: {n_layer: 2, n_head: 4, n_embd: 64, context: 64}\ntokenizer: {vocab_size: 512}\n"
                                      "pretrain: {steps: 2, batch_size: 2}\n---\nThe base.\n")
    (tmp_path / "ft.md").write_text("---\nsft: {from: base.md#model, steps: 3}\n---\nFine-tuned.\n")
    files, root = (str(tmp_path / "base.md"), str(tmp_path / "ft.md")), str(tmp_path / "state")
    short = factory("diff", *files, "--root", root)
    assert short.returncode == 0, short.stderr
    assert "model." not in short.stdout and "vocab_size" not in short.stdout and "(unset)" not in short.stdout
    assert "config: pretrain: only in base (steps=2, batch_size=2; the rest defaults)" in short.stdout
    every = factory("diff", *files, "--root", root, "--all")
    assert every.returncode == 0 and "config: model.n_embd: 64 (both)" in every.stdout and "sft.lr: '(unset)' -> 0.0003" in every.stdout


SMALL = """\
---
image: local
seed: 11
data:
  datasets:
    src:
      source: {{kind: directory, path: "{source}"}}
  blend:
    - {{dataset: src, weight: 1, mode: oversample}}
  validation_percent: 10
tokenizer: {{vocab_size: 300, min_frequency: 2, sample_bytes: 200000}}
model: {{n_layer: 1, n_head: 2, n_embd: 32, context: 32}}
pretrain: {{steps: 100000, batch_size: 4, lr: 0.003, warmup_steps: 2, checkpoint_every: 20, keep_last: 2, log_every: 10}}
---
Trains until stopped: a few files, a model of one thin layer.
"""


def small_experiment(tmp_path: Path, source: Path | None = None) -> Path:
    """An experiment that reads a copy of the standard library's json package (or `source`) and trains for long."""
    if source is None:
        source = tmp_path / "source"
        shutil.copytree(Path(sysconfig.get_paths()["stdlib"]) / "json", source / "json", ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "small.md"
    path.write_text(SMALL.format(source=source))
    return path


def started(*args: str) -> subprocess.Popen:
    """`factory ARGS` in a session of its own, as a terminal starts a command: `os.killpg` is then Ctrl-C."""
    return subprocess.Popen([sys.executable, "-m", "factory", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "FACTORY_TRACKER": "none"})


@pytest.mark.e2e
def test_a_failing_stage_is_its_own_message_and_the_log_path(tmp_path):
    """A setting the file cannot hold (the tracker, from the environment) fails the first stage that opens it."""
    path, root = small_experiment(tmp_path), tmp_path / "state"
    result = subprocess.run([sys.executable, "-m", "factory", "run", str(path), "--root", str(root)], capture_output=True, text=True,
                            timeout=600, env={**os.environ, "FACTORY_TRACKER": "bogus"})
    assert result.returncode == 1
    [said] = [line for line in result.stderr.splitlines() if " - INFO - " not in line]  # the stages' log lines aside
    assert said.startswith("error: pretrain: FACTORY_TRACKER='bogus' is not a tracker"), result.stderr[-3000:]
    log = Path(said.rsplit("(full log: ", 1)[1].rstrip(")"))
    assert "Stack Trace" in log.read_text() and "Stack Trace" not in result.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("profile", ["embedded", "deploy"])
def test_a_fresh_instance_has_the_ui_open_no_community_dialog(profile, tmp_path, monkeypatch, request):
    """Dagster's UI opens its "Join the Dagster community" dialog over the asset graph when the instance's `nux` is on (and
    nobody dismissed it yet); the dagster.yaml `dagster_home` writes turns it off, as it turns off telemetry."""
    from dagster import DagsterInstance
    from dagster._core.storage.runs import SqliteRunStorage

    from factory.cli.common import dagster_home

    if profile == "deploy":
        monkeypatch.setenv("FACTORY_DATABASE_URL", request.getfixturevalue("postgres"))
    else:
        monkeypatch.delenv("FACTORY_DATABASE_URL", raising=False)
    with DagsterInstance.from_config(str(dagster_home(tmp_path))) as instance:
        if profile == "deploy":
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        else:
            assert type(instance).__name__ == "FactoryInstance" and isinstance(instance.run_storage, SqliteRunStorage)
        assert not instance.nux_enabled and not instance.telemetry_enabled


def test_leaderboard_skips_a_garbage_manifest_with_a_warning_naming_it(tmp_path):
    registry = ArtifactStore(tmp_path / "registry")
    publish_result(registry, "a", "val_bpb", 2.0)
    (tmp_path / "registry" / "manifests" / "garbage.json").write_text('{"kind": "evaluation", "summary": []}')
    result = factory("leaderboard", "--root", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    assert [row["experiment"] for row in json.loads(result.stdout)["rows"]] == ["a"]
    assert "garbage.json" in result.stderr


def publish_files(registry: ArtifactStore, fingerprint: str, files: dict[str, bytes], kind: str = "tokenizer") -> Path:
    """Publish `files` as one artifact; its directory."""
    from factory.registry import Provenance

    with registry.staging() as out:
        for name, data in files.items():
            (out / name).write_bytes(data)
        manifest = registry.publish(out, kind=kind, fingerprint=fingerprint, config={}, inputs={}, code="c",
                                    provenance=Provenance(experiment="e", config_hash="h", git_commit="g"), summary={})
    return registry.path(manifest.digest)


def test_registry_verify_lists_every_kind_of_damage_and_exits_1(tmp_path):
    registry = ArtifactStore(tmp_path / "registry")
    publish_files(registry, "fp-clean", {"a.txt": b"clean"})
    clean = factory("registry", "verify", "--root", str(tmp_path))
    assert clean.returncode == 0, clean.stderr
    assert "intact" in clean.stdout
    damaged = {kind: publish_files(registry, f"fp-{kind}", {"a.txt": kind.encode(), "b.txt": b"b"})
               for kind in ("missing", "changed", "symlink", "extra")}
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"b")
    for base in damaged.values():
        base.chmod(0o755)
    (damaged["missing"] / "b.txt").unlink()
    (damaged["changed"] / "b.txt").chmod(0o644)
    (damaged["changed"] / "b.txt").write_bytes(b"B")
    (damaged["symlink"] / "b.txt").unlink()
    (damaged["symlink"] / "b.txt").symlink_to(outside)  # the same bytes, through a link
    (damaged["extra"] / "c.txt").write_bytes(b"c")
    (tmp_path / "registry" / "manifests" / "garbage.json").write_text("not json")
    result = factory("registry", "verify", "--root", str(tmp_path), "--json")
    assert result.returncode == 1, result.stderr
    found = {(d["kind"], Path(d["path"]).name, d["problem"]) for d in json.loads(result.stdout)["damaged"]}
    assert {(kind, name) for kind, name, _ in found} == {("manifest", "garbage.json"), *(("object", b.name) for b in damaged.values())}
    problems = {Path(path).name: problem for _, path, problem in found}
    assert problems[damaged["missing"].name] == "b.txt: missing"
    assert "sha256" in problems[damaged["changed"].name]
    assert "symlink" in problems[damaged["symlink"].name]
    assert "c.txt: extra file" in problems[damaged["extra"].name]
    text = factory("registry", "verify", "--root", str(tmp_path))
    assert text.returncode == 1 and "garbage.json" in text.stdout and "5 damaged" in text.stdout
