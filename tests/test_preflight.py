"""`factory check` on data sections: pinned table versions, weights, dataset names, source paths."""

import logging
import textwrap

import pytest

from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.tables import write_version
from factory.preflight import check_files
from tests.data.conftest import documents

LOG = logging.getLogger("test.preflight")


def experiment(tmp_path, data: str, name: str = "exp.md"):
    path = tmp_path / name
    path.write_text("---\ndata:\n" + textwrap.indent(textwrap.dedent(data).strip(), "  ") + "\n---\nwhy\n")
    return path


@pytest.fixture
def catalog_config(tmp_path):
    config = CatalogConfig.local(tmp_path / "iceberg")
    write_version(open_catalog(config), "curated.code", documents("code", {"a.py": "a = 1\n"}), LOG, tag="gold")
    return config


def test_a_pinned_version_that_exists_passes_and_a_missing_one_is_named(tmp_path, catalog_config):
    opened = []

    def catalog():
        opened.append(1)
        return open_catalog(catalog_config)

    good = experiment(tmp_path, "datasets: {}\nblend:\n  - {table: curated.code@gold}", "good.md")
    bad = experiment(tmp_path, "datasets: {}\nblend:\n  - {table: curated.code@v9}\n  - {table: curated.none@v1}", "bad.md")
    [ok, wrong] = check_files([good, bad], catalog=catalog)
    assert ok.ok, ok.errors
    assert len(wrong.errors) == 2
    assert "curated.code has no version tagged 'v9'; its tags: gold" in wrong.errors[0]
    assert wrong.errors[1].startswith(f"{bad}:6: data.blend.1.table: Iceberg table curated.none does not exist")
    assert opened == [1]  # the catalog is opened once, and only because a file pins a table


def test_files_without_pinned_tables_never_open_the_catalog(tmp_path, tiny_path):
    def catalog():
        raise AssertionError("opened")

    [report] = check_files([tiny_path], catalog=catalog)
    assert report.ok, report.errors


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("datasets: {a: {}}\nblend:\n  - {dataset: a, weight: -1}", "data.blend.0.weight"),
        ("datasets: {a: {}}\nblend:\n  - {dataset: a, weight: 0}", "blend weights are all zero"),
        ("datasets: {a: {}}\nblend:\n  - {dataset: b}", "blend names dataset 'b', which is not defined; datasets: a"),
        ("datasets: {a: {}}\nblend:\n  - {dataset: a, table: x.y@v1}", "exactly one of 'dataset'"),
        ("datasets: {a: {}}\nblend:\n  - {table: 'no-namespace@v1'}", "namespace.table@tag"),
        ("datasets: {Bad-Name: {}}", "lower_snake_case"),
        ("datasets: {a: {source: {kind: directory}}}", "needs 'path'"),
        ("datasets: {a: {dedup: {near_threshold: 2}}}", "near_threshold"),
        ("datasets: {a: {filters: {min_bytes: 10, max_lines: 3}}}", "max_lines"),
    ],
)
def test_bad_data_sections_are_config_errors_with_a_location(tmp_path, data, message):
    path = experiment(tmp_path, data)
    [report] = check_files([path])
    assert not report.ok
    assert message in "\n".join(report.errors)
    assert all(str(path) in error for error in report.errors)


def test_a_directory_source_that_is_not_there_is_reported(tmp_path):
    path = experiment(tmp_path, f"datasets: {{a: {{source: {{kind: directory, path: {tmp_path / 'absent'}}}}}}}")
    [report] = check_files([path])
    assert report.errors == [f"{path}:3: data.datasets.a.source.path: {str(tmp_path / 'absent')!r} is not a directory here"]


def test_a_custom_prompts_benchmark_needs_its_saved_version(tmp_path, tiny_path, catalog_config):
    from factory.data.prompts import save_prompt

    save_prompt(open_catalog(catalog_config), "def f():", "a note")
    files = []
    for tag in ("v1", "v2"):
        path = tmp_path / f"prompts-{tag}.md"
        path.write_text(f"---\nextends: {tiny_path}\nname: prompts-{tag}\neval: {{benchmarks: [val_bpb, custom_prompts.{tag}]}}\n---\nwhy\n")
        files.append(path)
    [saved, missing] = check_files(files, catalog=lambda: open_catalog(catalog_config))
    assert saved.ok, saved.errors
    assert missing.errors == [f"{files[1]}:4: eval.benchmarks: Iceberg table podium.custom_prompts has no version tagged 'v2'; its tags: v1"]
