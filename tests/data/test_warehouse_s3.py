"""The Iceberg warehouse in an object store: `FACTORY_STORE=s3://...` puts every table file in the bucket (a real S3
server process, moto's), the catalog database stays local, and versions read back as they were written."""

from __future__ import annotations

import boto3

from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.tables import read_version, resolve, stream_version, write_version
from tests.data.conftest import LOG, documents, ingest
from tests.s3server import running_s3

TABLE = "filtered.code"


def test_tables_in_an_s3_warehouse_are_written_to_the_bucket_and_read_back(tmp_path, monkeypatch):
    with running_s3(relay=False) as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("FACTORY_STORE", server.url)
        config = CatalogConfig.at(tmp_path)
        assert config.warehouse == f"{server.url}/warehouse" and config.uri.startswith("sqlite:///")
        assert "secret" not in str(config.to_json())  # credentials stay in the environment, out of stage requests
        catalog = open_catalog(config)
        first = write_version(catalog, TABLE, documents("code", {"a.py": "a = 1\n", "b.py": "b = 2\n"}), LOG)
        second = write_version(catalog, TABLE, documents("code", {"a.py": "a = 1\n", "c.py": "c = 3\n"}), LOG)
        assert set(read_version(catalog, TABLE, resolve(catalog, TABLE, "v1"))["path"].to_pylist()) == {"a.py", "b.py"}
        batches = stream_version(catalog, TABLE, second.snapshot_id, ("path", "text"))
        assert sorted(path for batch in batches for path in batch.column("path").to_pylist()) == ["a.py", "c.py"]

        client = boto3.client("s3", endpoint_url=server.endpoint)
        keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=server.bucket) for o in page.get("Contents", [])]
        assert any(k.startswith("factory/warehouse/filtered") and k.endswith(".parquet") for k in keys), keys
        assert any(k.endswith(".metadata.json") for k in keys)
        local = [p.name for p in tmp_path.rglob("*") if p.is_file()]
        assert local == ["catalog.db"]  # no table file on local disk
        assert first.snapshot_id != second.snapshot_id


def test_an_object_store_source_reads_the_objects_its_globs_match_and_copies_them_again_only_when_one_changes(tmp_path, monkeypatch):
    import hashlib

    import pytest

    from factory.config.data_sections import SourceConfig
    from factory.config.sources import changed_files, source_files, source_problems
    from factory.errors import ConfigError

    files = {"corpus/a.py": b"a = 1\n", "corpus/pkg/b.py": b"def b():\n    return 2\n", "corpus/notes.txt": b"not code\n", "other/c.py": b"c = 3\n"}
    with running_s3(relay=False) as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("FACTORY_CACHE", str(tmp_path / "cache"))
        client = boto3.client("s3", endpoint_url=server.endpoint)
        for key, data in files.items():
            client.put_object(Bucket=server.bucket, Key=key, Body=data)
        source = SourceConfig.model_validate({"kind": "object-store", "uri": f"s3://{server.bucket}/corpus", "include": ["**/*.py"]})
        first = source_files(source)
        assert first.files == {"a.py": hashlib.sha256(files["corpus/a.py"]).hexdigest(), "pkg/b.py": hashlib.sha256(files["corpus/pkg/b.py"]).hexdigest()}
        ingested = ingest("bucket", source)
        assert sorted(ingested.documents["text"].to_pylist()) == ["a = 1\n", "def b():\n    return 2\n"]
        reads = sum(server.reads().values())
        assert source_files(source) == first and sum(server.reads().values()) == reads  # listed again, not read again

        client.put_object(Bucket=server.bucket, Key="corpus/pkg/b.py", Body=b"def b():\n    return 3\n")
        second = source_files(source)
        assert second.digest != first.digest and second.root != first.root
        assert changed_files(first.files, second.files) == "1 changed (pkg/b.py)"

        assert source_problems(SourceConfig.model_validate({"kind": "object-store", "uri": str(tmp_path)}), ()) == [
            ((), f"uri: {str(tmp_path)!r} is not an object store's prefix: write s3://bucket/prefix (files on this machine are a "
                 "source of kind `directory`)")]
        with pytest.raises(ConfigError, match=r"source\.uri=s3://no-such-bucket/corpus: .* has no bucket 'no-such-bucket'"):
            source_files(SourceConfig.model_validate({"kind": "object-store", "uri": "s3://no-such-bucket/corpus"}))


def test_a_table_read_waits_out_an_endpoint_that_comes_back_within_the_outage_window(tmp_path, monkeypatch):
    """pyarrow, under pyiceberg, retries for the store's outage window (factory/storage/s3_retry.py), not its default three
    times in about a tenth of a second."""
    import threading
    import time

    with running_s3() as server:
        for name, value in {**server.env(), "FACTORY_STORE": server.url, "FACTORY_STORE_OUTAGE_S": "30"}.items():
            monkeypatch.setenv(name, value)
        catalog = open_catalog(CatalogConfig.at(tmp_path))
        written = write_version(catalog, TABLE, documents("code", {"a.py": "a = 1\n", "b.py": "b = 2\n"}), LOG)
        server.kill()
        back = threading.Timer(2.0, server.restart)
        back.start()
        cut = time.monotonic()
        try:
            batches = stream_version(catalog, TABLE, written.snapshot_id, ("path", "text"))
            assert sorted(path for batch in batches for path in batch.column("path").to_pylist()) == ["a.py", "b.py"]
            assert time.monotonic() - cut >= 1.5  # read after the endpoint came back, not before it went
        finally:
            back.join()


def test_a_table_read_past_the_outage_window_says_which_setting_allows_longer_outages(tmp_path, monkeypatch):
    """pyarrow's OSError for an endpoint that stayed away (`AWS Error NETWORK_CONNECTION ...`) is said as a store request
    says it (what stages and commands print, factory/storage/s3_retry.py), one line; any other OSError is left as it is."""
    import pytest

    from factory.storage.s3_retry import warehouse_outage

    with running_s3() as server:
        for name, value in {**server.env(), "FACTORY_STORE": server.url, "FACTORY_STORE_OUTAGE_S": "0.5"}.items():
            monkeypatch.setenv(name, value)
        catalog = open_catalog(CatalogConfig.at(tmp_path))
        written = write_version(catalog, TABLE, documents("code", {"a.py": "a = 1\n"}), LOG)
        server.kill()
        try:
            with pytest.raises(OSError) as raised:
                list(stream_version(catalog, TABLE, written.snapshot_id, ("path", "text")))
        finally:
            server.restart()
    message = str(warehouse_outage(raised.value))
    assert message.startswith("the warehouse's store did not answer: ") and "AWS Error NETWORK_CONNECTION" in message
    assert message.endswith("still failing after 0.5 s of retries: rerun once it answers, or allow longer outages with "
                            "FACTORY_STORE_OUTAGE_S (at most 100 s)") and "\n" not in message
    assert warehouse_outage(FileNotFoundError(2, "No such file or directory", str(tmp_path / "gone"))) is None
