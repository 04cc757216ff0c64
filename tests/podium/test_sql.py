"""The SQL box: one SELECT over a snapshot, no files, parameters, row and time limits."""

import pytest

from factory.podium.errors import PodiumError
from factory.podium.sql import parse_params
from tests.podium.conftest import TABLE, versions


@pytest.mark.parametrize("query, message", [
    ("DELETE FROM t", "only SELECT"),
    ("SELECT 1; SELECT 2", "exactly one statement"),
    ("COPY t TO '/tmp/podium-out.csv'", "only SELECT"),
    ("ATTACH '/tmp/podium.db'", "only SELECT"),
    ("SELECT * FROM read_text('/etc/passwd')", "disabled"),
    ("SELECT * FROM read_csv_auto('/etc/hostname')", "disabled"),
    ("SELECT * FROM '/etc/passwd'", "does not exist"),
    ("SELEC 1", "does not parse"),
    ("WITH x AS (COPY (SELECT 1) TO '/tmp/podium-cte.csv') SELECT 1", "holds COPY inside"),
    ("WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x", "holds DELETE inside"),
    ("SELECT * FROM (WITH y AS (INSERT INTO t VALUES (1)) SELECT 1)", "holds INSERT inside"),
    ("SELECT " + "(SELECT " * 300 + "1" + ")" * 300, "the query nests too deep to be checked"),
])
def test_sql_box_refuses_anything_but_one_select_over_the_table(browser, query, message):
    _, v2 = versions(browser)
    with pytest.raises(PodiumError, match=message):
        browser.sql(TABLE, v2, query)


def test_sql_box_parameters_and_limits(browser):
    _, v2 = versions(browser)
    result = browser.sql(TABLE, v2, "SELECT id FROM samples WHERE score < ? ORDER BY id", [3])
    assert [row[0].text for row in result.rows] == ["s0000", "s0001", "s0002"]
    assert browser.sql(TABLE, v2, "SELECT count(*) FROM t WHERE label = $l", {"l": "hostile"}).rows == [(1,)]
    limited = browser.sql(TABLE, v2, "SELECT * FROM range(100000)", row_limit=10)
    assert len(limited.rows) == 10 and limited.truncated
    with pytest.raises(PodiumError, match="0.3 s limit"):
        browser.sql(TABLE, v2, "SELECT sum(a.range * b.range) FROM range(100000000) a, range(1000) b", seconds=0.3)


@pytest.mark.parametrize("text, message", [("[1", "JSON list or object"), ("3", "must be a JSON list")])
def test_parameters_are_json(text, message):
    with pytest.raises(PodiumError, match=message):
        parse_params(text)
    assert parse_params("") == [] and parse_params('{"a": 1}') == {"a": 1}
