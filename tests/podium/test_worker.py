"""The SQL box's worker: queries run as same-origin POSTs in a process of their own, bounded in memory, time, rows and bytes."""

import threading

import psutil
import pyarrow as pa
import pytest
from starlette.testclient import TestClient

from factory.podium import worker
from factory.podium.app import create_app
from factory.podium.errors import PodiumError
from factory.podium.worker import run_query

LOCAL = "http://127.0.0.1:8765"
SQL = "/t/sft.samples/sql"
MARKER = "SELECT 'ran' || '-' || 'query' AS marker"


@pytest.fixture(scope="module")
def client(store):
    """A browser on this machine: its form posts name Podium's origin."""
    return TestClient(create_app(store), base_url=LOCAL, raise_server_exceptions=False, headers={"origin": LOCAL})


class PeakRss:
    """The highest resident memory this (the server's) process reaches while the block runs, sampled in a thread."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.start = self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def started_since(before: set[int]) -> list[psutil.Process]:
    """This process's children started after `before` was taken (not the ones other tests of this worker left, such as
    multiprocessing's resource tracker), zombies included: a worker not reaped is one too many."""
    return [child for child in psutil.Process().children() if child.pid not in before]


def test_a_memory_bomb_is_stopped_in_its_worker_and_the_server_stays_small(client):
    before = {child.pid for child in psutil.Process().children()}
    with PeakRss() as rss:
        response = client.post(SQL, data={"q": "SELECT length(repeat('x', 2200000000)) AS n"})
    assert response.status_code == 400, response.text[-2000:]
    assert "more memory than the SQL box allows" in response.text or "GiB a query may use" in response.text
    assert "2200000000" not in response.text.split("</textarea>", 1)[1], "the query must not have produced its value"
    assert rss.peak - rss.start < 300 << 20, f"the server grew by {(rss.peak - rss.start) >> 20} MiB"
    assert started_since(before) == [], "the worker is gone"


def test_a_get_shows_the_form_and_runs_nothing(client):
    response = client.get(SQL, params={"q": MARKER})
    assert response.status_code == 200
    assert "ran-query" not in response.text and 'id="sql-rows"' not in response.text
    assert "&#39;ran&#39; || &#39;-&#39;" in response.text, "the query is shown in the form, to be posted"
    posted = client.post(SQL, data={"q": MARKER})
    assert posted.status_code == 200 and "ran-query" in posted.text


@pytest.mark.parametrize("headers", [{"origin": "http://attacker.example"}, {"origin": "null"}, {"origin": ""}])
def test_a_query_posted_from_another_site_is_refused(client, headers):
    response = client.post(SQL, data={"q": MARKER}, headers=headers)
    assert response.status_code == 403 and "ran-query" not in response.text


def test_a_query_waits_for_a_free_worker_then_is_told_the_box_is_busy(client, monkeypatch):
    taken = threading.BoundedSemaphore(1)
    taken.acquire()
    monkeypatch.setattr(worker, "_slots", taken)
    monkeypatch.setattr(worker, "BUSY_WAIT_S", 0.05)
    response = client.post(SQL, data={"q": MARKER})
    assert response.status_code == 503 and "the SQL box is busy" in response.text
    assert response.headers["retry-after"] == "5"


def test_a_worker_past_its_deadline_is_killed(monkeypatch):
    monkeypatch.setattr(worker, "KILL_GRACE_S", 0.0)
    before = {child.pid for child in psutil.Process().children()}
    with pytest.raises(PodiumError, match="ran past the 0.001 s limit"):
        run_query({"t": pa.table({"a": [1]})}, "SELECT * FROM t", seconds=0.001)
    assert started_since(before) == [], "the killed worker was reaped"


def test_rows_come_back_bounded_in_bytes_and_typed():
    table = pa.table({"a": list(range(100))})
    result = run_query({"t": table}, "SELECT a, repeat('x', 100) AS s, 1.50::DECIMAL(4, 2) AS d FROM t ORDER BY a",
                       result_bytes=2000)
    assert result.truncated and 0 < len(result.rows) < 20
    first = result.rows[0]
    assert first[0] == 0 and first[1].text == "x" * 100 and str(first[2]) == "1.50"
