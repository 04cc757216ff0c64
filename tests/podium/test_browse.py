"""Podium's reads: pages, filters, sorting, time travel, diffs, the SQL box's limits, custom prompts, completions."""

import threading

import pytest

from factory.data.catalog import CatalogConfig, open_catalog
from factory.podium.browse import POSITION, Browser, Filter, NotFound, PageQuery, PodiumError
from factory.podium.generate import Generator, candidates
from factory.podium.links import checkpoint_url, table_links, table_url
from factory.podium.prompts import TABLE as PROMPTS, read_prompts, save_prompt
from factory.registry import ArtifactStore

from tests.podium.conftest import TABLE


@pytest.fixture(scope="module")
def browser(store):
    return Browser(open_catalog(CatalogConfig.local(store / "iceberg")))


def versions(browser):
    info = browser.info(TABLE)
    return info.snapshot("v1").id, info.snapshot("v2").id


def test_tables_snapshots_and_tags(browser):
    assert "sft" in browser.namespaces()
    assert TABLE in browser.tables("sft")
    info = browser.info(TABLE)
    assert info.rows == 131
    assert info.snapshot("").refs[:2] == ("main", "v2")
    assert info.snapshot("v1").rows == 130
    assert [c for c, _ in info.columns][:3] == ["id", "label", "prompt"]
    with pytest.raises(NotFound, match="it has: main, v1, v2"):
        info.snapshot("v9")


def test_pages_filter_sort_and_only_read_what_they_show(store):
    browser = Browser(open_catalog(CatalogConfig.local(store / "iceberg")))
    _, v2 = versions(browser)
    page = browser.page(TABLE, v2, PageQuery(columns=("id", "score"), sort="score", descending=True, offset=10, size=25))
    assert page.matched == page.total == 131
    expected = sorted([i for i in range(130) if i != 5] + [900, 901], reverse=True)[10:35]
    assert [r["score"] for r in page.rows] == expected
    assert page.rows[0]["id"] == (f"s{expected[0]:04d}", 5)  # strings come as (preview, full length)
    cached = {column for (_, _, column) in browser.cache._columns}
    assert cached == {"id", "score"}, "a page reads only the columns it shows and sorts on"
    filtered = browser.page(TABLE, v2, PageQuery(columns=("id",), filters=(Filter(column="label", operator="=", value="ok"),
                                                                          Filter(column="score", operator=">=", value="100"))))
    assert filtered.matched == 32 and all(r["id"][0] >= "s0100" for r in filtered.rows)
    assert browser.page(TABLE, v2, PageQuery(filters=(Filter(column="prompt", operator="contains", value="f77("),))).matched == 1
    assert browser.page(TABLE, v2, PageQuery(filters=(Filter(column="metadata", operator="matches", value=r'"i": 1\d\b'),))).matched == 10


def test_time_travel_reads_the_old_version(browser):
    v1, v2 = versions(browser)
    broken = PageQuery(filters=(Filter(column="label", operator="=", value="broken"),))
    assert browser.page(TABLE, v1, broken).matched == 1
    assert browser.page(TABLE, v2, broken).matched == 0
    position = browser.page(TABLE, v1, broken).rows[0][POSITION]
    assert browser.row(TABLE, v1, position)["metadata"] == '{"source": "mined", "difficulty" 2}'


def test_diff_counts_rows_added_and_removed(browser):
    v1, v2 = versions(browser)
    diff = browser.diff(TABLE, v1, v2)
    assert (diff.added_count, diff.removed_count) == (3, 2)
    assert sorted(r["id"][0] for r in diff.added) == ["s0001", "s0900", "s0901"]
    assert sorted(r["id"][0] for r in diff.removed) == ["s0001", "s0005"]
    assert browser.diff(TABLE, v2, v2).added_count == 0


@pytest.mark.parametrize("query, message", [
    ("DELETE FROM t", "only SELECT"),
    ("SELECT 1; SELECT 2", "exactly one statement"),
    ("COPY t TO '/tmp/podium-out.csv'", "only SELECT"),
    ("ATTACH '/tmp/podium.db'", "only SELECT"),
    ("SELECT * FROM read_text('/etc/passwd')", "disabled"),
    ("SELECT * FROM read_csv_auto('/etc/hostname')", "disabled"),
    ("SELECT * FROM '/etc/passwd'", "does not exist"),
    ("SELEC 1", "does not parse"),
])
def test_sql_box_refuses_anything_but_one_select_over_the_table(browser, query, message):
    _, v2 = versions(browser)
    with pytest.raises(PodiumError, match=message):
        browser.sql(TABLE, v2, query)


def test_sql_box_parameters_and_limits(browser):
    _, v2 = versions(browser)
    result = browser.sql(TABLE, v2, "SELECT id FROM samples WHERE score < ? ORDER BY id", [3])
    assert result.rows == [("s0000",), ("s0001",), ("s0002",)]
    assert browser.sql(TABLE, v2, "SELECT count(*) FROM t WHERE label = $l", {"l": "hostile"}).rows == [(1,)]
    limited = browser.sql(TABLE, v2, "SELECT * FROM range(100000)", row_limit=10)
    assert len(limited.rows) == 10 and limited.truncated
    with pytest.raises(PodiumError, match="0.3 s limit"):
        browser.sql(TABLE, v2, "SELECT sum(a.range * b.range) FROM range(100000000) a, range(1000) b", seconds=0.3)


@pytest.mark.parametrize("name", ["../etc", "sft/../../x", "sft.samples.x", "a.b;drop", "sft.", ".samples"])
def test_names_from_urls_are_validated(browser, name):
    with pytest.raises(NotFound):
        browser.info(name)


def test_unknown_columns_and_bad_filter_values_say_what_to_change(browser):
    _, v2 = versions(browser)
    with pytest.raises(PodiumError, match="no column 'nope'; its columns: id, label"):
        browser.page(TABLE, v2, PageQuery(columns=("nope",)))
    with pytest.raises(PodiumError, match="'ten' is not a int64 value"):
        browser.page(TABLE, v2, PageQuery(filters=(Filter(column="score", operator=">", value="ten"),)))
    with pytest.raises(NotFound, match="131 rows; there is no row 131"):
        browser.row(TABLE, v2, 131)


def test_saved_prompts_are_versions_an_eval_can_pin(tmp_path):
    catalog = open_catalog(CatalogConfig.local(tmp_path / "iceberg"))
    assert save_prompt(catalog, "def f(x):\n    return", "the model stops early", "sft.samples@v1#3/prompt") == "v1"
    tags = []
    threads = [threading.Thread(target=lambda i=i: tags.append(save_prompt(open_catalog(CatalogConfig.local(tmp_path / "iceberg")),
                                                                          f"prompt {i}", f"note {i}"))) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(tags) == ["v2", "v3", "v4"], "concurrent saves each get their own version"
    assert [p["note"] for p in read_prompts(catalog, "v1")] == ["the model stops early"]
    assert len(read_prompts(catalog, "v4")) == 4, "no save is lost"
    with pytest.raises(PodiumError, match="empty"):
        save_prompt(catalog, "  ", "note")
    assert PROMPTS in Browser(catalog).tables("podium")


def test_completions_come_from_the_chosen_checkpoint_and_are_repeatable(store):
    registry = ArtifactStore(store / "registry")
    found = candidates(registry)
    assert sorted(c.experiment for c in found) == ["podium-seed1", "podium-seed2"]
    generator = Generator(registry)
    one, two = (generator.find(c.sha256) for c in sorted(found, key=lambda c: c.experiment))
    first = generator.complete(one, "def f(x):\n    return", new_tokens=6)
    assert first.tokens <= 6 and first.candidate == one
    assert generator.complete(one, "def f(x):\n    return", new_tokens=6).text == first.text
    assert generator.complete(two, "def f(x):\n    return", new_tokens=6).text != first.text
    with pytest.raises(NotFound, match="no published checkpoint"):
        generator.find("0" * 64)
    with pytest.raises(PodiumError, match="between 1 and 256"):
        generator.complete(one, "x", new_tokens=1000)


def test_links_point_at_pages(monkeypatch):
    monkeypatch.setenv("FACTORY_PODIUM_URL", "http://podium.internal:9000/")
    assert table_url("raw.stdlib", 42) == "http://podium.internal:9000/t/raw.stdlib?snapshot=42"
    assert checkpoint_url("ab" * 32) == f"http://podium.internal:9000/checkpoint/{'ab' * 32}"
    assert table_links({"stdlib/table": "filtered.stdlib@v2", "stdlib/rows": 10}) == {
        "podium/stdlib": "http://podium.internal:9000/t/filtered.stdlib?snapshot=v2"
    }
