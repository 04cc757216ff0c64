"""The Iceberg warehouse in an object store: `FACTORY_STORE=s3://...` puts every table file in the bucket (a real S3
server process, moto's), the catalog database stays local, and versions read back as they were written."""

from __future__ import annotations

import boto3

from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.tables import read_version, resolve, stream_version, write_version
from tests.data.conftest import LOG, documents
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
