"""Source kinds as plugins: a package adds `source.kind` values through `model_factory.sources`; the raw stage lists
and reads their files like a built-in source's."""

import json
import os
import subprocess
import sys

from tests.plugins.conftest import REPO, fake_package, factory_with

SOURCE = """\
from pathlib import Path

from factory.config.source_kinds import SourceKind

CORPUS = SourceKind(name="corpus", description="the team's corpus", root=lambda config: Path({root!r}))
"""
EXPERIMENT = """\
---
data:
  datasets:
    code:
      source: {{kind: {kind}, include: ["**/*.py"]}}
tokenizer: {{vocab_size: 300, min_frequency: 2, sample_bytes: 20000}}
---
A source a plugin declares.
"""


def test_a_plugin_source_kind_is_checked_listed_and_read(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "pkg").mkdir(parents=True)
    (corpus / "pkg" / "a.py").write_text("def a():\n    return 1\n")
    (corpus / "notes.txt").write_text("not code")
    site = fake_package(tmp_path / "site", "corpus_source", SOURCE.format(root=str(corpus)), {})
    (site / "corpus_source-0.1.dist-info" / "entry_points.txt").write_text("[model_factory.sources]\ncorpus = corpus_source:CORPUS\n")
    path = tmp_path / "exp.md"
    path.write_text(EXPERIMENT.format(kind="corpus"))

    assert factory_with(site, "check", str(path)).returncode == 0
    probe = ("import json, sys, logging; from factory.config import load; from factory.config.sources import source_files; "
             "from factory.data.ingest import read_documents; source = load(sys.argv[1]).data.datasets['code'].source; "
             "print(json.dumps([sorted(source_files(source).files), read_documents('code', source, logging.getLogger()).documents['path'].to_pylist()]))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    shown = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert json.loads(shown.stdout) == [["pkg/a.py"], ["pkg/a.py"]], shown.stderr


def test_an_unknown_source_kind_names_the_known_ones_at_its_line(tmp_path):
    path = tmp_path / "exp.md"
    path.write_text(EXPERIMENT.format(kind="corpus"))
    result = factory_with(None, "check", str(path))
    assert result.returncode == 2
    assert (f"{path}:5: data.datasets.code.source.kind: unknown source kind 'corpus'; known: python-stdlib, site-packages, "
            "directory (a plugin package adds others)") in result.stderr, result.stderr


def test_a_plugin_that_redeclares_a_built_in_source_is_refused(tmp_path):
    site = fake_package(tmp_path / "site", "clash_source", SOURCE.format(root="/").replace('name="corpus"', 'name="directory"'), {})
    (site / "clash_source-0.1.dist-info" / "entry_points.txt").write_text("[model_factory.sources]\ndirectory = clash_source:CORPUS\n")
    path = tmp_path / "exp.md"
    path.write_text(EXPERIMENT.format(kind="python-stdlib"))
    result = factory_with(site, "check", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert ("plugin 'directory' (clash_source:CORPUS of package clash-source) declares the source kind 'directory', which built in "
            "declares already") in result.stderr, result.stderr
