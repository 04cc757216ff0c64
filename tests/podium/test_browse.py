"""Podium's reads: tables and snapshots, pages, filters, sorting, time travel, diffs."""

import pytest

from factory.data.catalog import CatalogConfig, open_catalog
from factory.podium.browse import POSITION, Browser, Filter, PageQuery
from factory.podium.cells import Preview
from factory.podium.errors import NotFound, PodiumError
from tests.podium.conftest import TABLE, versions


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
    assert page.rows[0]["id"] == Preview(f"s{expected[0]:04d}", 5)
    cached = {column for (_, _, column) in browser.cache.keys()}
    assert cached == {"id", "score"}, "a page reads only the columns it shows and sorts on"
    filtered = browser.page(TABLE, v2, PageQuery(columns=("id",), filters=(Filter(column="label", operator="=", value="ok"),
                                                                          Filter(column="score", operator=">=", value="100"))))
    assert filtered.matched == 32 and all(r["id"].text >= "s0100" for r in filtered.rows)
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
    assert sorted(r["id"].text for r in diff.added) == ["s0001", "s0900", "s0901"]
    assert sorted(r["id"].text for r in diff.removed) == ["s0001", "s0005"]
    assert browser.diff(TABLE, v2, v2).added_count == 0


@pytest.mark.parametrize("name", ["../etc", "sft/../../x", "sft.samples.x", "a.b;drop", "sft.", ".samples"])
def test_names_from_urls_are_validated(browser, name):
    with pytest.raises(NotFound, match="not a valid name|not a table name"):
        browser.info(name)


def test_unknown_columns_and_bad_filter_values_say_what_to_change(browser):
    _, v2 = versions(browser)
    with pytest.raises(PodiumError, match="no column 'nope'; its columns: id, label"):
        browser.page(TABLE, v2, PageQuery(columns=("nope",)))
    with pytest.raises(PodiumError, match="'ten' is not a int64 value"):
        browser.page(TABLE, v2, PageQuery(filters=(Filter(column="score", operator=">", value="ten"),)))
    with pytest.raises(NotFound, match="131 rows; there is no row 131"):
        browser.row(TABLE, v2, 131)
