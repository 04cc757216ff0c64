"""Operations on a small experiment, in the deploy profile: lineage, reproduce (matching and not), promote gating, demote.

The stores are the deploy profile's: Dagster's storage and the Iceberg catalog in a real
PostgreSQL server. The experiment has every stage tiny-code-lm has, at a size a test can
afford to reproduce, and reads a directory of Python files (copied from the standard library),
so a test can change its data after the fact, as a person editing a source would.
"""

import json
import shutil
import sysconfig
import warnings
from pathlib import Path

import pytest
from click.testing import Result
from dagster import AssetKey, DagsterInstance, PreviewWarning
from typer.testing import CliRunner

from assets.execution import failure_messages
from assets.run import run_experiment
from factory.cli import app
from factory.cli.common import dagster_home
from factory.data.catalog import CatalogConfig, open_catalog
from factory.errors import ConfigError
from factory.registry import ArtifactStore
from factory.ops.promote import demote, grounds

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
RECIPE = """\
---
seed: 7
data:
  datasets:
    src:
      source: {{kind: directory, path: "{source}"}}
  blend:
    - {{dataset: src, weight: 1}}
  validation_percent: 10
tokenizer: {{vocab_size: 320, min_frequency: 2, sample_bytes: 400000}}
model: {{n_layer: 1, n_head: 2, n_embd: 32, context: 32}}
pretrain: {{steps: 12, batch_size: 4, lr: 0.003, warmup_steps: 2, checkpoint_every: 6, keep_last: 2, log_every: 6}}
{extra}---
# ops-small: a model small enough to reproduce in a test
"""


def factory(*args: str, root: Path) -> Result:
    """The command line, in this process (promotion still runs Dagster in its own)."""
    return CliRunner().invoke(app, [*args, "--root", str(root)])


@pytest.fixture(scope="module")
def deploy_profile(postgres):
    """$FACTORY_DATABASE_URL set for this module (and the processes it starts)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FACTORY_DATABASE_URL", postgres)
        yield postgres


@pytest.fixture(scope="module")
def small(tmp_path_factory, deploy_profile):
    """The experiment materialized once through Dagster; its root, source directory, experiments directory and model."""
    warnings.filterwarnings("ignore", category=PreviewWarning)
    base = tmp_path_factory.mktemp("ops")
    source = base / "source"
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for package in ("json", "email"):
        shutil.copytree(stdlib / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    experiments = base / "experiments"
    experiments.mkdir()
    path = experiments / "ops-small.md"
    path.write_text(RECIPE.format(source=source, extra=""))
    root = base / "root"
    instance = DagsterInstance.from_config(str(dagster_home(root)))
    result = run_experiment(path, root, instance, quiet=True)
    assert result.success, failure_messages(result)
    [model] = [m for m in ArtifactStore(root / "registry").manifests("model")]
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    assert "src" in {t[-1] for t in open_catalog(CatalogConfig.at(root)).list_tables("raw")}
    assert not (root / "iceberg" / "catalog.db").exists(), "the catalog is PostgreSQL's, not the embedded sqlite"
    return {"root": root, "source": source, "experiments": experiments, "model": model, "instance": instance, "path": path}


def test_lineage_answers_which_data_made_the_model_and_which_models_a_version_made(small):
    root, model = small["root"], small["model"]
    up = factory("lineage", model.digest[:12], "--json", root=root)
    assert up.exit_code == 0, up.output
    [answer] = json.loads(up.stdout)

    def walk(node):
        yield node
        for child in node.get("from", []):
            yield from walk(child)

    upstream = list(walk(answer["upstream"]))
    assert {n["kind"] for n in upstream} >= {"model", "pretrain", "tokenizer", "blend", "filtered_datasets", "raw_datasets"}
    assert "raw.src@v1" in {ref for n in upstream for ref in n.get("written", [])}
    assert all(n["git_commit"] and n["code"].startswith("local:") for n in upstream)
    down = factory("lineage", "filtered.src@v1", "--json", root=root)
    assert down.exit_code == 0, down.output
    [version] = json.loads(down.stdout)
    assert [m["digest"] for m in version["models"]] == [model.digest]
    text = factory("lineage", "raw.src", root=root)
    assert "models trained on it: ops-small" in text.stdout
    missing = factory("lineage", "raw.src@v9", root=root)
    assert missing.exit_code == 2 and "versions written: raw.src@v1" in missing.stderr


def test_reproduce_gates_promotion_and_demotion_keeps_history(small):
    root, model, experiments = small["root"], small["model"], small["experiments"]
    registry = ArtifactStore(root / "registry")
    allowed, problems = grounds(registry, model, experiments)
    assert allowed is None and "never reproduced" in problems[0]

    same = factory("reproduce", model.digest[:12], "--json", root=root)
    assert same.exit_code == 0, same.output
    record = json.loads(same.stdout)
    assert record["matched"] and [s["kind"] for s in record["stages"]][-2:] == ["pretrain", "model"]

    promote = ["promote", model.digest[:12], "--as", "production", "--experiments", str(experiments)]
    promoted = factory(*promote, "--reason", "first release", root=root)
    assert promoted.exit_code == 0, promoted.output
    assert "reproduction 1 matched" in promoted.stdout and "3 of 3 blocking checks passed" in promoted.stdout
    shown = small["instance"].fetch_materializations(AssetKey("production_model"), limit=1).records[0]
    metadata = {k: v.value for k, v in shown.asset_materialization.metadata.items()}
    assert metadata["model"] == model.digest and metadata["reason"] == "first release"

    # A source file changes after the fact: the reproduction stops at the first stage, which reads it.
    (small["source"] / "json" / "decoder.py").write_text("x = 1\n" * 40)
    drifted = factory("reproduce", model.digest[:12], root=root)
    assert drifted.exit_code == 1
    assert "first difference: raw_datasets: data: it reads the datasets' sources" in drifted.stdout, drifted.output
    assert "source src: 1 changed (json/decoder.py)" in drifted.stdout, drifted.output  # which file, not only that one did
    again = factory(*promote, root=root)
    assert again.exit_code == 1 and "the last reproduction did not match: raw_datasets" in again.stderr, again.output

    # Its file may say why it cannot reproduce (not part of the recipe's hash): then it may be promoted.
    small["path"].write_text(RECIPE.format(source=small["source"], extra="nondeterministic: the source directory is a live checkout\n"))
    allowed, problems = grounds(registry, model, experiments)
    assert allowed == "the experiment says it is not deterministic: the source directory is a live checkout" and not problems

    rolled = factory("demote", "--as", "production", "--reason", "bad release", root=root)
    assert rolled.exit_code == 0 and "production rolled back -> no model" in rolled.stdout, rolled.output
    history = json.loads(factory("promotions", "--json", root=root).stdout)
    assert [r["action"] for r in history["history"]] == ["promote", "demote"] and history["model"] is None
    assert history["history"][0]["model"] == model.digest, "the history keeps what was in production"
    with pytest.raises(ConfigError, match="nothing to demote"):
        demote(registry, "production", "again")
