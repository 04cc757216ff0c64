"""Benchmarks are plugins like stage kinds: declared by an installed package's entry point, listed with their direction,
refused by name when broken, and their code is part of each score's fingerprint (an edit makes old scores stale)."""

import importlib
import json
import sys

from factory.evals.base import Benchmark
from factory.stages.evaluation import CheckpointRef, EvalItem
from tests.conftest import training_settings
from tests.plugins.conftest import REPO, factory_with, fake_package

PLUGIN = '''
from factory.evals.base import Benchmark, Score

def run(inputs):
    return Score(value=0.5, count=1)

BREVITY = Benchmark(name="brevity", version=1, lower_is_better=True, run=run, data="fixed prompts",
                    description="how short the answers are")
'''


def test_a_benchmark_declared_by_an_entry_point_is_listed_with_its_direction(tmp_path):
    site = fake_package(tmp_path, "brevity_bench", PLUGIN, {"brevity": "brevity_bench:BREVITY"}, group="model_factory.benchmarks")
    listed = factory_with(site, "evals", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    by_name = {b["name"]: b for b in json.loads(listed.stdout)}
    assert by_name["brevity"]["better"] == "lower" and by_name["brevity"]["description"] == "how short the answers are"
    assert by_name["brevity"]["code"].startswith("plugin:") and by_name["humaneval"]["code"] == ""


def test_an_entry_point_naming_another_benchmark_or_something_else_is_refused_naming_the_plugin(tmp_path):
    site = fake_package(tmp_path / "a", "brevity_bench", PLUGIN, {"shortness": "brevity_bench:BREVITY"}, group="model_factory.benchmarks")
    wrong_name = factory_with(site, "evals", "list")
    assert wrong_name.returncode == 2 and "plugin 'shortness'" in wrong_name.stderr and "declares the benchmark 'brevity'" in wrong_name.stderr
    site = fake_package(tmp_path / "b", "brevity_bench", PLUGIN, {"brevity": "brevity_bench:run"}, group="model_factory.benchmarks")
    not_one = factory_with(site, "evals", "list")
    assert not_one.returncode == 2 and "names a function, not a Benchmark" in not_one.stderr
    assert "Traceback" not in wrong_name.stderr + not_one.stderr


def score_fingerprint(bench: Benchmark) -> str:
    from factory.evals.benchmarks import BENCHMARKS

    spec = {"kind": "pretrain", "config": training_settings("pretrain"), "upstream": {"blend": "b" * 64}, "code": "t"}
    checkpoint = CheckpointRef(key="x__pretrain-000001", experiment="x", step=1, tokens_seen=1, path="unused", sha256="0" * 64,
                               training=spec, eval={"max_bytes": 1000, "batch_size": 8}, git_commit="0" * 40)
    BENCHMARKS[bench.name] = bench
    try:
        return EvalItem(partition=f"{bench.name}|{checkpoint.key}", benchmark=bench.name, checkpoint=checkpoint).fingerprint("local:t")
    finally:
        del BENCHMARKS[bench.name]


def test_an_edit_of_a_plugin_benchmarks_code_changes_its_scores_fingerprints_without_a_version_bump(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "brevity_bench.py").write_text(PLUGIN)
    before = importlib.import_module("brevity_bench").BREVITY
    first = score_fingerprint(before)
    assert before.code.startswith("plugin:") and score_fingerprint(before) == first  # the same code: the same fingerprint
    (tmp_path / "brevity_bench.py").write_text(PLUGIN.replace("value=0.5", "value=0.25"))
    del sys.modules["brevity_bench"]
    after = importlib.import_module("brevity_bench").BREVITY
    assert after.version == before.version and score_fingerprint(after) != first
    del sys.modules["brevity_bench"]


def test_the_factorys_own_benchmarks_add_nothing_to_the_fingerprint_their_code_identity_covers():
    from factory.evals.benchmarks import benchmark

    assert benchmark("heldout_bpb").code == benchmark("humaneval").code == ""


def test_a_file_naming_a_benchmark_whose_package_is_missing_is_refused_at_check_naming_the_package(tmp_path):
    needy = PLUGIN + 'NEEDY = Benchmark(name="needy", version=1, lower_is_better=False, run=run, requires=("no-such-dist",), description="d")\n'
    site = fake_package(tmp_path / "site", "brevity_bench", needy, {"brevity": "brevity_bench:BREVITY", "needy": "brevity_bench:NEEDY"},
                        group="model_factory.benchmarks")
    text = (REPO / "experiments" / "tiny-code-lm.md").read_text()
    line = text.splitlines().index("  benchmarks: [heldout_bpb, val_bpb, next_line]") + 1
    (tmp_path / "needy.md").write_text(text.replace("[heldout_bpb, val_bpb, next_line]", "[heldout_bpb, needy]"))
    (tmp_path / "brevity.md").write_text(text.replace("[heldout_bpb, val_bpb, next_line]", "[heldout_bpb, brevity]"))
    refused = factory_with(site, "check", str(tmp_path / "needy.md"))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"needy.md:{line + 1}" in refused.stderr or f"needy.md:{line}" in refused.stderr
    assert "benchmark 'needy' needs the package no-such-dist, which is not installed here: pip install no-such-dist" in refused.stderr
    assert factory_with(site, "check", str(tmp_path / "brevity.md")).returncode == 0


def test_a_humaneval_variant_declared_elsewhere_scores_again_when_its_settings_change():
    from factory.evals.humaneval import HumanEvalSettings
    from factory.evals.suite import humaneval_benchmark

    first = humaneval_benchmark("humaneval.mine", HumanEvalSettings(problems=10), "mine")
    assert first.code == ""  # the family's run is the factory's own code: only its settings tell variants apart
    assert score_fingerprint(first) == score_fingerprint(humaneval_benchmark("humaneval.mine", HumanEvalSettings(problems=10), "mine"))
    assert score_fingerprint(first) != score_fingerprint(humaneval_benchmark("humaneval.mine", HumanEvalSettings(problems=12), "mine"))
