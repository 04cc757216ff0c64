"""Podium's HTTP side: escaping, error pages instead of tracebacks, and what a hostile request cannot do."""

import datetime
import decimal
import logging
from pathlib import Path

import pyarrow as pa
import pytest
from starlette.testclient import TestClient

from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.tables import write_version
from factory.podium.app import create_app
from factory.podium.body import MAX_BODY_BYTES, MAX_FORM_FIELDS
from factory.podium.generate import candidates
from factory.registry import ArtifactStore
from tests.podium.conftest import ATTRIBUTE, SAMPLE_SCHEMA, SCRIPT, TABLE, sample

LOCAL = "http://127.0.0.1:8765"


@pytest.fixture(scope="module")
def client(store):
    """A browser on this machine: its form posts name Podium's origin."""
    return TestClient(create_app(store), base_url=LOCAL, raise_server_exceptions=False, headers={"origin": LOCAL})


@pytest.mark.parametrize("path, form", [("/t/sft.samples?col=prompt&col=completion&col=metadata", None), ("/t/sft.samples/row/2", None),
                                        ("/t/sft.samples/sql", {"q": "SELECT * FROM t WHERE label = 'hostile'"})])
def test_every_cell_is_escaped(client, path, form):
    response = client.post(path, data=form) if form else client.get(path)
    assert response.status_code == 200, response.text
    assert SCRIPT not in response.text and ATTRIBUTE not in response.text
    assert "&lt;script&gt;alert(" in response.text
    assert "script-src" not in response.headers["content-security-policy"]  # default-src 'none': no script runs at all
    assert "default-src 'none'" in response.headers["content-security-policy"]


def test_a_hostile_filter_value_and_column_stay_text(client):
    response = client.get("/t/sft.samples", params={"fc": "label", "fo": "=", "fv": SCRIPT})
    assert response.status_code == 200 and SCRIPT not in response.text
    response = client.get("/t/sft.samples", params={"col": SCRIPT})
    assert response.status_code == 400 and SCRIPT not in response.text
    assert "has no column" in response.text


@pytest.mark.parametrize("path, status, message", [
    ("/t/..%2F..%2Fetc%2Fpasswd", 404, "there is no page at /t/../../etc/passwd"),
    ("/t/sft.%2E%2E", 404, "not a valid name"),
    ("/t/nope.nothing", 404, "there is no table nope.nothing"),
    ("/t/sft.samples?snapshot=v7", 404, "no snapshot, tag or branch"),
    ("/t/sft.samples?size=7", 400, "page size must be one of"),
    ("/t/sft.samples?offset=-1", 400, "the offset must be between 0 and"),
    ("/t/sft.samples?offset=99999999999999999999", 400, "the offset must be between 0 and"),
    ("/t/sft.samples?fc=label&fo=matches&fv=(", 400, "the filters cannot be applied"),
    ("/t/sft.%2E%2E/row/1", 404, "not a valid name"),
    ("/t/sft.samples/row/999", 404, "there is no row 999"),
    ("/t/sft.samples/row/" + "9" * 5000, 400, "the row number must be a whole number of at most 30 digits"),
    ("/t/sft.samples/row/two", 400, "the row number must be a whole number"),
    ("/t/sft.samples?offset=" + "9" * 5000, 400, "offset must be a whole number of at most 30 digits"),
    ("/generate?table=sft.samples&snapshot=v1&column=prompt&row=" + "9" * 5000, 400, "row must be a whole number of at most"),
    ("/t/sft.samples?fc=score&fo=%3E&fv=lots", 400, "is not a int64 value"),
    ("/t/sft.samples?fc=score&fo=eval&fv=1", 400, "unknown filter operator"),
    ("/checkpoint/" + "0" * 64, 404, "no published checkpoint"),
    ("/checkpoint/..%2F..%2Fetc", 404, "there is no page at"),
    ("/checkpoint/abc", 404, "not a checkpoint sha256"),
])
def test_bad_requests_get_an_error_page_that_says_what_to_change(client, path, status, message):
    response = client.get(path)
    assert response.status_code == status
    assert message in response.text
    assert "Traceback (most recent call last)" not in response.text


def test_custom_prompts_before_any_is_saved(tmp_path):
    """On a root of its own: the module's store gets a saved prompt in another test, in whichever order they run."""
    open_catalog(CatalogConfig.local(tmp_path / "iceberg"))
    response = TestClient(create_app(tmp_path), base_url=LOCAL, raise_server_exceptions=False).get("/t/podium.custom_prompts")
    assert response.status_code == 404 and "no custom prompts are saved yet" in response.text
    assert "Traceback (most recent call last)" not in response.text


def test_an_unreadable_table_shows_an_error_page(tmp_path):
    catalog = open_catalog(CatalogConfig.local(tmp_path / "iceberg"))
    rows = [sample(i, f"p{i}", "c", "{}") for i in range(3)]
    write_version(catalog, "sft.lost", pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA), logging.getLogger("test"), schema=SAMPLE_SCHEMA)
    write_version(catalog, "sft.kept", pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA), logging.getLogger("test"), schema=SAMPLE_SCHEMA)
    for task in catalog.load_table("sft.lost").scan().plan_files():
        Path(task.file.file_path.removeprefix("file://")).unlink()
    client = TestClient(create_app(tmp_path), base_url=LOCAL, raise_server_exceptions=False)
    response = client.get("/t/sft.lost")
    assert response.status_code == 400
    assert "cannot be read" in response.text and "Traceback (most recent call last)" not in response.text
    assert client.get("/").status_code == 200, "the index still lists the other tables"


def test_huge_cells_are_cut_until_show_all(client):
    cut = client.get("/t/sft.samples/row/3")
    assert "show all" in cut.text and "x" * 20_001 not in cut.text
    whole = client.get("/t/sft.samples/row/3?full=prompt")
    assert whole.text.count("x") > 60_000


def test_only_this_machines_names_and_same_origin_posts(store, client):
    outsider = TestClient(create_app(store), base_url="http://podium.attacker.example", raise_server_exceptions=False)
    assert outsider.get("/").status_code == 400, "a DNS-rebound Host header is refused"
    for origin in ("http://attacker.example", "null"):
        response = client.post("/prompts", data={"prompt": "x", "note": "y"}, headers={"origin": origin})
        assert response.status_code == 403, origin
    bare = TestClient(create_app(store), base_url=LOCAL, raise_server_exceptions=False)
    assert bare.post("/prompts", data={"prompt": "x", "note": "y"}).status_code == 403, "a post that names no origin"
    exposed = TestClient(create_app(store, host="0.0.0.0", allowed_hosts=["podium.team.example"]), base_url="http://podium.team.example",
                         raise_server_exceptions=False)
    assert exposed.get("/").status_code == 200, "--host with --allowed-host serves that name"
    rebound = TestClient(create_app(store, host="0.0.0.0"), base_url="http://podium.attacker.example", raise_server_exceptions=False)
    assert rebound.get("/").status_code == 400, "exposed, it still refuses names that are not this machine's"


def test_lists_structs_binary_and_timestamps_show_as_text(tmp_path):
    catalog = open_catalog(CatalogConfig.local(tmp_path / "iceberg"))
    chats = [[{"role": "user", "content": "hi <b>"}, {"role": "assistant", "content": "hello"}], []]
    table = pa.table({
        "id": ["a", "b"], "messages": chats, "blob": [b"\x00\xffbytes", None],
        "at": pa.array([datetime.datetime(2026, 1, 2, 3, 4), None], pa.timestamp("us")),
        "price": pa.array([decimal.Decimal("1.50"), None], pa.decimal128(6, 2)), "sha256": ["x", "y"], "bytes": [1, 2],
    })
    write_version(catalog, "sft.chats", table, logging.getLogger("test"), schema=table.schema)
    client = TestClient(create_app(tmp_path), base_url=LOCAL, raise_server_exceptions=False)
    page = client.get("/t/sft.chats")
    assert page.status_code == 200, page.text
    assert "&#34;role&#34;: &#34;user&#34;, &#34;content&#34;: &#34;hi &lt;b&gt;&#34;" in page.text
    assert "\ufffdbytes" in page.text and "2026-01-02T03:04:00" in page.text and "1.50" in page.text
    sample = client.get("/t/sft.chats/row/0")
    assert sample.status_code == 200 and 'class="turn role-user"' in sample.text
    wrong = client.get("/t/sft.chats", params={"fc": "at", "fo": ">", "fv": "yesterday"})
    assert wrong.status_code == 400 and "the filters cannot be applied" in wrong.text
    assert client.get("/t/sft.chats", params={"fc": "at", "fo": ">", "fv": "2026-01-01"}).text.count("open-row") == 1


def test_generate_and_save_a_prompt_from_a_sample(store, client):
    shas = [c.sha256 for c in candidates(ArtifactStore(store / "registry"))]
    form = client.get("/generate", params={"table": TABLE, "snapshot": "v1", "row": "0", "column": "prompt"})
    assert "def add(a, b):" in form.text and "sft.samples@" in form.text
    response = client.post("/generate", data={"ckpt": shas, "prompt": "def add(a, b):", "new_tokens": "4"})
    assert response.status_code == 200 and response.text.count('class="completion"') == 2
    missing = client.post("/generate", data={"prompt": "def add(a, b):"})
    assert missing.status_code == 400 and "choose at least one checkpoint" in missing.text
    many = client.post("/generate", data={"prompt": "x", "ckpt": [f"{i:064x}" for i in range(7)]})
    assert many.status_code == 400 and "at most 6" in many.text
    assert client.get(f"/checkpoint/{shas[0]}", follow_redirects=False).headers["location"] == f"/generate?ckpt={shas[0]}"
    saved = client.post("/prompts", data={"prompt": "def add(a, b):", "note": SCRIPT, "source": "custom"})
    assert saved.status_code == 200 and "podium.custom_prompts@v" in saved.text
    assert SCRIPT not in saved.text


def test_columns_whose_names_need_escaping_show(tmp_path):
    """Iceberg stores `my col` as `my_x20col` in its Parquet files; Podium reads it by field id and shows its real name."""
    catalog = open_catalog(CatalogConfig.local(tmp_path / "iceberg"))
    odd = pa.table({"id": ["a", "b"], "my col": [1, 2], 'say "hi"': ["<i>x</i>", "y"], "x.y": [1.5, 2.5]})
    catalog.create_namespace_if_not_exists("sft")
    catalog.create_table("sft.odd", schema=odd.schema).append(odd)
    client = TestClient(create_app(tmp_path), base_url=LOCAL, raise_server_exceptions=False, headers={"origin": LOCAL})
    for path in ("/t/sft.odd", "/t/sft.odd?sort=my+col&desc=1", "/t/sft.odd?fc=x.y&fo=%3E&fv=2", "/t/sft.odd/row/0", "/t/sft.odd/diff"):
        response = client.get(path)
        assert response.status_code == 200, (path, response.text[-2000:])
        assert "say &#34;hi&#34;" in response.text and "my col" in response.text, path
    assert client.get("/t/sft.odd?fc=x.y&fo=%3E&fv=2").text.count("open-row") == 1
    result = client.post("/t/sft.odd/sql", data={"q": 'SELECT "my col", "say ""hi""" FROM t ORDER BY "my col"'})
    assert result.status_code == 200 and "&lt;i&gt;x&lt;/i&gt;" in result.text


@pytest.mark.parametrize("path", ["/prompts", "/generate", "/t/sft.samples/sql"])
def test_an_uploaded_file_in_a_form_is_refused(client, path):
    response = client.post(path, data={"note": "n"}, files={"prompt": ("prompt.txt", b"def add(a, b):"), "q": ("q.sql", b"SELECT 1")})
    assert response.status_code == 400
    assert "not uploaded files" in response.text or "must be text, not an uploaded file" in response.text
    assert "UploadFile" not in response.text


def test_a_request_body_over_the_bound_is_refused_before_it_is_read(client):
    response = client.post("/prompts", content=b"prompt=" + b"x" * MAX_BODY_BYTES,
                           headers={"content-type": "application/x-www-form-urlencoded"})
    assert response.status_code == 413 and "over 1024 KiB" in response.text
    chunks = (b"q=" + b"x" * (1 << 16) if i == 0 else b"x" * (1 << 16) for i in range(40))  # chunked: no length declared
    streamed = client.post("/t/sft.samples/sql", content=chunks, headers={"content-type": "application/x-www-form-urlencoded"})
    assert streamed.status_code == 413 and "over 1024 KiB" in streamed.text
    assert client.get("/t/sft.samples").status_code == 200, "the server goes on serving"


def test_a_form_of_too_many_fields_is_refused(client):
    response = client.post("/generate", data={f"f{i}": "x" for i in range(999)})
    assert response.status_code == 400 and f"at most {MAX_FORM_FIELDS} text fields" in response.text


def test_a_query_nested_too_deep_is_a_400_not_a_server_error(client):
    response = client.post("/t/sft.samples/sql", data={"q": "SELECT " + "(SELECT " * 300 + "1" + ")" * 300})
    assert response.status_code == 400 and "the query nests too deep" in response.text


@pytest.mark.parametrize("temperature", ["nan", "1e-320", "-1", "inf", "-inf", "6", "0.001"])
def test_a_temperature_out_of_range_is_a_400_naming_it(store, client, temperature):
    shas = [c.sha256 for c in candidates(ArtifactStore(store / "registry"))]
    response = client.post("/generate", data={"ckpt": shas[:1], "prompt": "def add(a, b):", "new_tokens": "4", "temperature": temperature})
    assert response.status_code == 400 and "temperature must be 0 (greedy) or between 0.01 and 5.0" in response.text
    assert 'class="completion"' not in response.text


def test_a_sampled_completion_at_a_finite_temperature(store, client):
    shas = [c.sha256 for c in candidates(ArtifactStore(store / "registry"))]
    response = client.post("/generate", data={"ckpt": shas[:1], "prompt": "def add(a, b):", "new_tokens": "4", "temperature": "0.7"})
    assert response.status_code == 200 and response.text.count('class="completion"') == 1
