"""The example document-filter plugin (examples/doc-filters), installed as a package: its filters run after the built-in
ones, on Daft's worker processes, count what they removed, and enter the filtered stage's fingerprint."""

import logging
import os
from pathlib import Path

import pyarrow as pa
import pytest

from factory.config import load, plan_stage
from factory.config.filter_kinds import document_filters
from factory.config.data_sections import FiltersConfig
from factory.data.documents import ARROW_SCHEMA
from factory.data.filters import apply_filters
from factory.data.catalog import CatalogConfig, open_catalog
from factory.errors import StageFailed
from tests.plugins.conftest import REPO, factory_with, fake_package, installed, pip_installed
from tests.stages.conftest import run_stages

EXPERIMENT = """\
---
name: filtered
image: local
data:
  datasets:
    code:
      source: {{kind: directory, path: {data}}}
      filters: {{min_bytes: 1{custom}}}
tokenizer: {{vocab_size: 300, min_frequency: 2, sample_bytes: 20000}}
---
A dataset filtered by plugins.
"""
WHERE_IT_RAN = '''
import os
import signal
from factory.plugin import DocumentFilter

def keep(document):
    with open(os.environ["WHERE_IT_RAN"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    if "boom" in document["text"]:
        raise ValueError("cannot judge this one")
    return "drop me" not in document["text"]

RECORDED = DocumentFilter(name="recorded", keep=keep, description="records the process it ran in")

def kill(document):
    if "kill me" in document["text"]:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer, or a lost machine, ends a worker
    return True

KILLER = DocumentFilter(name="killer", keep=kill, description="SIGKILLs the worker judging a document that asks for it")
'''


@pytest.fixture(scope="module")
def filters_site(tmp_path_factory) -> Path:
    site = pip_installed(tmp_path_factory.mktemp("filters-site"), REPO / "examples" / "doc-filters")
    return fake_package(site, "where_it_ran", WHERE_IT_RAN, {"recorded": "where_it_ran:RECORDED", "killer": "where_it_ran:KILLER"}, group="model_factory.filters")


@pytest.fixture
def on_workers(filters_site, monkeypatch, tmp_path) -> Path:
    """The plugins registered here and in the processes Daft starts; the file the `recorded` filter writes its pid to."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(filters_site), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("WHERE_IT_RAN", str(tmp_path / "pids"))
    with installed(filters_site):
        yield tmp_path / "pids"


def documents(texts: list[str]) -> pa.Table:
    rows = [{"id": f"d{i}", "source": "code", "path": f"f{i}.py", "text": text, "bytes": len(text.encode()), "sha256": f"{i:064x}",
             "metadata": "{}"} for i, text in enumerate(texts)]
    return pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)


def test_plugin_filters_run_on_the_workers_after_the_built_in_ones_count_what_they_removed_and_name_a_failure(on_workers):
    texts = ["x", "def f():\n    return 1\n", "<<<<<<< HEAD\na = 1\n=======\na = 2\n>>>>>>> other\n",
             "".join(f"# In[{i}]:\nprint({i})\n" for i in range(5)), "keep me", "please drop me"]
    config = FiltersConfig(min_bytes=2, custom=("no_merge_conflicts", "no_notebook_dumps", "recorded"))
    result = apply_filters(documents(texts), config, logging.getLogger("test"))
    assert result.documents["text"].to_pylist() == ["def f():\n    return 1\n", "keep me"]  # in order
    assert result.removed == {"min_bytes": 1, "no_merge_conflicts": 1, "no_notebook_dumps": 1, "recorded": 1}
    ran_in = set(on_workers.read_text().split())
    assert ran_in and str(os.getpid()) not in ran_in  # every document was judged in a worker process, none here

    # a filter that fails names itself, its package and the document
    failing = FiltersConfig(custom=("no_merge_conflicts", "recorded"))
    with pytest.raises(StageFailed, match=r"the filter 'recorded' \(plugin 'recorded'.*\): ValueError: cannot judge this one \(document d1, f1.py\)"):
        apply_filters(documents(["fine", "boom"]), failing, logging.getLogger("test"))


def test_a_worker_killed_mid_stage_fails_the_stage_saying_so_and_publishes_no_version(on_workers, tmp_path, tiny_path, capfd):
    files = {"a.py": "a = 1\n", "b.py": "# kill me\nb = 2\n", "c.py": "c = 3\n"}
    run_stages(tmp_path, tiny_path, files, "killed", "filtered_datasets", {"filters": {"custom": ["killer"]}}, last_fails=True)
    said = "".join(capfd.readouterr())
    assert "a worker process of the plugin filters killer died" in said, said
    catalog = open_catalog(CatalogConfig.local(tmp_path / "catalog"))
    assert catalog.table_exists("dedup.code") and not catalog.table_exists("filtered.code")  # no version, not even a partial one


def test_the_plugins_code_enters_the_filtered_stages_fingerprint_and_nothing_else_changes(on_workers, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.py").write_text("a = 1\n")
    plain, custom = tmp_path / "plain.md", tmp_path / "custom.md"
    plain.write_text(EXPERIMENT.format(data=data, custom=""))
    custom.write_text(EXPERIMENT.format(data=data, custom=", custom: [no_merge_conflicts]"))
    upstream = {"deduped_datasets": "d" * 64}
    with_plugin, without = plan_stage(load(custom), "filtered_datasets", upstream), plan_stage(load(plain), "filtered_datasets", upstream)
    assert "model-factory-doc-filters:" in with_plugin.code and " " not in without.code
    assert "custom" not in without.config["datasets"]["code"]["filters"]  # files without it keep their fingerprints
    assert with_plugin.config["datasets"]["code"]["filters"]["custom"] == ["no_merge_conflicts"]
    assert plan_stage(load(custom), "deduped_datasets", {"raw_datasets": "r" * 64}) == plan_stage(load(plain), "deduped_datasets",
                                                                                                    {"raw_datasets": "r" * 64})


def test_check_names_an_unknown_filter_at_its_line_and_the_example_that_declares_it(tmp_path):
    document_filters.cache_clear()
    data = tmp_path / "data"
    data.mkdir()
    path = tmp_path / "exp.md"
    path.write_text(EXPERIMENT.format(data=data, custom=", custom: [no_merge_conflicts]"))
    result = factory_with(None, "check", str(path), env={"FACTORY_DATA_ROOTS": str(tmp_path)})
    assert result.returncode == 2, result.stdout + result.stderr
    said = result.stdout + result.stderr
    assert f"{path}:8" in said and "unknown filter 'no_merge_conflicts'" in said and "Traceback" not in said
    assert "pip install -e examples/doc-filters" in said
