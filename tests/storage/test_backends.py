"""A backend is a module and one `BACKENDS` entry: the registry opens it by its scheme, and the Iceberg warehouse in its
store takes the file IO properties it gives (`table_properties`), with no edit elsewhere."""

from __future__ import annotations

import sys
import types

import pytest

from factory import storage
from factory.data.catalog import CatalogConfig
from factory.registry import open_registry
from factory.registry.objects import ObjectRegistry
from factory.storage import table_properties
from factory.storage.local import LocalStore


class ElsewhereStore(LocalStore):
    """A stand-in for a new backend (`elsewhere://bucket/prefix`): a local directory under a test's temporary path."""

    root_dir = ""

    @classmethod
    def from_uri(cls, uri: str, setting: str, patient: bool = False) -> ElsewhereStore:
        return cls(f"{cls.root_dir}/{uri.partition('://')[2]}")

    @classmethod
    def table_properties(cls, uri: str) -> dict[str, str]:
        return {"elsewhere.endpoint": "https://elsewhere.example", "elsewhere.warehouse": uri}


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    module = types.ModuleType("elsewhere_backend")
    module.ElsewhereStore = ElsewhereStore
    monkeypatch.setitem(sys.modules, "elsewhere_backend", module)
    monkeypatch.setitem(storage.BACKENDS, "elsewhere", "elsewhere_backend:ElsewhereStore")
    monkeypatch.setattr(ElsewhereStore, "root_dir", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("FACTORY_STORE", "elsewhere://bucket/team")


def test_a_new_backend_serves_the_registry_and_configures_the_warehouse_from_its_entry_alone(elsewhere, tmp_path):
    registry = open_registry(tmp_path / "root" / "registry")
    assert isinstance(registry, ObjectRegistry) and isinstance(registry.store, ElsewhereStore)
    config = CatalogConfig.at(tmp_path / "root")
    assert config.warehouse == "elsewhere://bucket/team/warehouse"
    assert table_properties(config.warehouse) == {"elsewhere.endpoint": "https://elsewhere.example",
                                                  "elsewhere.warehouse": "elsewhere://bucket/team/warehouse"}


def test_s3_gives_pyiceberg_the_aws_variables_set_and_retries_for_the_outage_window(monkeypatch):
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    assert table_properties("s3://bucket/prefix/warehouse") == {
        "s3.endpoint": "http://127.0.0.1:9000", "s3.region": "eu-west-1", "s3.access-key-id": "id", "s3.secret-access-key": "secret",
        "s3.retry-strategy-impl": "factory.storage.s3_retry.OutageRetry"}


def test_a_local_warehouse_needs_no_properties_and_an_unknown_scheme_is_named(tmp_path):
    assert table_properties((tmp_path / "warehouse").as_uri()) == {} == table_properties(str(tmp_path))
    with pytest.raises(storage.ConfigError, match=r"FACTORY_STORE=gs://b/w: unknown scheme gs://; the stores known are file://, s3://"):
        table_properties("gs://b/w")
