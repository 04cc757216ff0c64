"""The example plugin (examples/checkpoint-average), installed as a package: its `average` stage is checked and placed in
the Dagster lineage, with nothing in factory/ naming it (tests/plugins/test_dpo.py runs it end to end, beside DPO)."""

import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from tests.plugins.conftest import REPO, factory_with

pytestmark = pytest.mark.e2e
EXPERIMENT = """\
---
image: local
seed: 3
data:
  datasets:
    src:
      source: {{kind: directory, path: "{source}"}}
  blend:
    - {{dataset: src, weight: 1, mode: oversample}}
  validation_percent: 10
tokenizer: {{vocab_size: 300, min_frequency: 2, sample_bytes: 200000}}
model: {{n_layer: 1, n_head: 2, n_embd: 32, context: 32}}
pretrain: {{steps: 30, batch_size: 4, lr: 0.003, warmup_steps: 2, checkpoint_every: 10, keep_last: 3, log_every: 10}}
average:
  last: {last}
eval: {{benchmarks: [val_bpb], max_bytes: 20000}}
---
The last three checkpoints of a short run, averaged.
"""


@pytest.fixture
def averaged(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(os.path.join(sysconfig.get_paths()["stdlib"], "json"), source / "json", ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "averaged.md"
    path.write_text(EXPERIMENT.format(source=source, last=3))
    return path


def test_the_dagster_lineage_puts_the_plugin_stage_after_its_inputs_and_before_the_checkpoints(example_site):
    probe = ("from dagster import AssetKey; from assets.definitions import defs; g = defs.resolve_asset_graph(); "
             "print(sorted(k.to_user_string() for k in g.get(AssetKey('average')).parent_keys)); "
             "print('average' in {k.to_user_string() for k in g.get(AssetKey('checkpoints')).parent_keys}); "
             "print(g.get(AssetKey('average')).pools)")
    env = {**os.environ, "PYTHONPATH": str(example_site)}
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert shown.stdout.splitlines() == ["['blend', 'pretrain', 'rl', 'sft', 'tokenizer']", "True", "{'training'}"], shown.stderr


def test_a_file_using_a_kind_that_is_not_installed_says_which_package_to_install(averaged):
    result = factory_with(None, "check", str(averaged))
    assert result.returncode == 2
    assert (f"{averaged}:14: average: section of the stage kind 'average', which is not installed: install the package that "
            "declares it (pip install -e examples/checkpoint-average)") in result.stderr


def test_the_plugins_section_is_checked_with_file_and_line(example_site, averaged):
    averaged.write_text(averaged.read_text().replace("  last: 3", "  last: 1"))
    result = factory_with(example_site, "check", str(averaged))
    assert result.returncode == 2
    assert f"{averaged}:15: average.last: Input should be greater than or equal to 2 (found 1)" in result.stderr, result.stderr
