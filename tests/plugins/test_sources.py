"""Source kinds as plugins: a package adds `source.kind` values through `model_factory.sources`; the raw stage lists
and reads their files like a built-in source's."""

import json
import os
import subprocess
import sys

import pytest

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
             "from tests.data.conftest import ingest; source = load(sys.argv[1]).data.datasets['code'].source; "
             "print(json.dumps([sorted(source_files(source).files), ingest('code', source).documents['path'].to_pylist()]))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    shown = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert json.loads(shown.stdout) == [["pkg/a.py"], ["pkg/a.py"]], shown.stderr


@pytest.mark.parametrize(("kind", "said"), [
    ("corpus", "a plugin package adds others"),
    ("git", "install the package that declares it: pip install -e examples/git-source"),  # an example of this checkout declares it
])
def test_an_unknown_source_kind_names_the_known_ones_at_its_line(tmp_path, kind, said):
    path = tmp_path / "exp.md"
    path.write_text(EXPERIMENT.format(kind=kind))
    result = factory_with(None, "check", str(path))
    assert result.returncode == 2
    assert (f"{path}:5: data.datasets.code.source.kind: unknown source kind {kind!r}; known: python-stdlib, site-packages, "
            f"directory, object-store, iceberg ({said})") in result.stderr, result.stderr


def test_a_plugin_that_redeclares_a_built_in_source_is_refused(tmp_path):
    site = fake_package(tmp_path / "site", "clash_source", SOURCE.format(root="/").replace('name="corpus"', 'name="directory"'), {})
    (site / "clash_source-0.1.dist-info" / "entry_points.txt").write_text("[model_factory.sources]\ndirectory = clash_source:CORPUS\n")
    path = tmp_path / "exp.md"
    path.write_text(EXPERIMENT.format(kind="python-stdlib"))
    result = factory_with(site, "check", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert ("plugin 'directory' (clash_source:CORPUS of package clash-source) declares the source kind 'directory', which built in "
            "declares already") in result.stderr, result.stderr


FIELDED = """\
from pathlib import Path

from factory.plugin import ConfigError, Section, SourceKind


class ShelfFields(Section):
    shelf: str
    \"\"\"Which shelf of the corpus.\"\"\"
    limit: int = 10


def check(fields: ShelfFields) -> None:
    if fields.shelf == "broken":
        raise RuntimeError("the plugin's own bug")
    if not (Path({root!r}) / fields.shelf).is_dir():
        raise ConfigError(f"shelf: no shelf {{fields.shelf!r}}; name one of the corpus's directories")


SHELF = SourceKind(name="shelf", description="a shelf of the corpus", root=lambda source: Path({root!r}) / source.fields.shelf,
                   fields=ShelfFields, check=check)
"""
SHELF_EXPERIMENT = """\
---
data:
  datasets:
    code:
      source:
        kind: shelf
{fields}
tokenizer: {{vocab_size: 300, min_frequency: 2, sample_bytes: 20000}}
---
A source whose kind adds fields.
"""


def shelf_site(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "left").mkdir(parents=True)
    (corpus / "left" / "a.py").write_text("def a():\n    return 1\n")
    site = fake_package(tmp_path / "site", "shelf_source", FIELDED.format(root=str(corpus)), {"shelf": "shelf_source:SHELF"},
                        group="model_factory.sources")
    return site


def shelf_file(tmp_path, name: str, *fields: str):
    path = tmp_path / f"{name}.md"
    path.write_text(SHELF_EXPERIMENT.format(fields="\n".join(f"        {field}" for field in fields)))
    return path


def test_a_kinds_own_fields_are_validated_by_its_type_each_at_its_line(tmp_path):
    site = shelf_site(tmp_path)
    good = shelf_file(tmp_path, "good", "shelf: left")
    assert factory_with(site, "check", str(good)).returncode == 0
    bad = shelf_file(tmp_path, "bad", "limit: many", "colour: red", "include: 3")
    result = factory_with(site, "check", str(bad))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert f"{bad}:9: data.datasets.code.source.include: Input should be a valid tuple (found 3)" in lines, result.stderr
    assert f"{bad}:5: data.datasets.code.source.shelf: required field is missing" in lines, result.stderr
    assert (f"{bad}:7: data.datasets.code.source.limit: Input should be a valid integer, unable to parse string as an integer "
            "(found 'many')") in lines, result.stderr
    assert (f"{bad}:8: data.datasets.code.source.colour: unknown key; allowed here: columns, exclude, format, include, kind, limit, "
            "max_file_bytes, path, revision, shelf, text_field") in lines, result.stderr


def test_a_kinds_check_is_reported_at_the_source_and_a_crash_in_it_as_the_plugins_fault(tmp_path):
    site = shelf_site(tmp_path)
    missing = shelf_file(tmp_path, "missing", "shelf: right")
    broken = shelf_file(tmp_path, "broken", "shelf: broken")
    result = factory_with(site, "check", str(missing), str(broken))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert (f"{missing}:5: data.datasets.code.source: shelf: no shelf 'right'; name one of the corpus's directories"
            in result.stderr.splitlines()), result.stderr
    assert (f"{broken}:5: data.datasets.code.source: plugin 'shelf' (shelf_source:SHELF of package shelf-source): the check of source "
            "kind 'shelf' failed (RuntimeError: the plugin's own bug); fix the plugin or uninstall it") in result.stderr.splitlines()
    planned = factory_with(site, "plan", str(missing), "--root", str(tmp_path / "state"))
    assert planned.returncode == 2 and "Traceback" not in planned.stderr, planned.stderr
    assert "source: shelf: no shelf 'right'; name one of the corpus's directories" in planned.stderr


def test_a_kinds_fields_enter_the_raw_stages_fingerprint_as_written(tmp_path):
    site = shelf_site(tmp_path)
    path = shelf_file(tmp_path, "exp", "shelf: left")
    probe = ("import json, sys; from factory.config import load, plan_stage; "
             "print(json.dumps(plan_stage(load(sys.argv[1]), 'raw_datasets', {}).config['sources']['code']))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    shown = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    source = json.loads(shown.stdout)
    assert (source["kind"], source["shelf"], source["limit"]) == ("shelf", "left", 10), shown.stderr


@pytest.mark.parametrize(("old", "new", "refusal"), [
    ("fields=ShelfFields", "fields=dict", " gives the source kind 'shelf' fields of <class 'dict'>, not a Section subclass"),
    ("    limit: int = 10", "    limit: int = 10\n    include: str = ''",
     ": source kind 'shelf' declares the fields include, which every source has already; rename them"),
])
def test_a_kind_whose_fields_are_not_a_section_or_take_a_sources_own_name_is_refused_naming_the_plugin(tmp_path, old, new, refusal):
    module = FIELDED.format(root="/").replace(old, new)
    site = fake_package(tmp_path / "site", "shelf_source", module, {"shelf": "shelf_source:SHELF"}, group="model_factory.sources")
    result = factory_with(site, "check", str(shelf_file(tmp_path, "exp", "shelf: left")))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"plugin 'shelf' (shelf_source:SHELF of package shelf-source){refusal}" in result.stderr, result.stderr
