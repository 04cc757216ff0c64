"""Opening a store: a location that cannot work is one ConfigError naming the setting to change, before any work; an
S3 endpoint that goes away later is waited for, within `FACTORY_STORE_OUTAGE_S`, and past it is a StorageError naming that
setting; the objects are there again when it is back."""

import threading
import time

import pytest

from factory.errors import ConfigError, StorageError
from factory.storage import BACKENDS, open_store
from tests.ports import free_port
from tests.s3server import running_s3


@pytest.fixture
def aws(s3_server, monkeypatch):
    """The session's S3 server's variables, set for this test."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    return s3_server


def one_line_config_error(location: str, **options) -> str:
    with pytest.raises(ConfigError) as raised:
        open_store(location, **options)
    message = str(raised.value)
    assert "\n" not in message and "Traceback" not in message and "Debug" not in message, message
    assert raised.value.exit_code == 2
    return message


def test_an_unknown_scheme_names_the_setting_and_the_schemes_known():
    message = one_line_config_error("gs://bucket/prefix")
    assert message.startswith("FACTORY_STORE=gs://bucket/prefix: unknown scheme gs://")
    assert all(f"{scheme}://" in message for scheme in BACKENDS)
    assert one_line_config_error("gs://b/p", setting="store (deploy/cluster.yaml)").startswith("store (deploy/cluster.yaml)=gs://")


def test_a_bucket_that_does_not_exist(aws):
    message = one_line_config_error("s3://no-such-bucket/prefix")
    assert f"FACTORY_STORE=s3://no-such-bucket/prefix: {aws.endpoint} has no bucket 'no-such-bucket': create it, or change FACTORY_STORE" == message


def test_an_endpoint_that_does_not_answer_names_the_variable_that_set_it(aws, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    assert "cannot reach http://127.0.0.1:" in one_line_config_error(aws.url)
    assert one_line_config_error(aws.url).split(": check ")[1].startswith("AWS_ENDPOINT_URL (")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")
    assert ": check AWS_ENDPOINT_URL_S3 (" in one_line_config_error(aws.url)


def test_malformed_s3_locations():
    assert "bucket name of 3-63 characters" in one_line_config_error("s3://UPPER/prefix")
    assert "bucket name of 3-63 characters" in one_line_config_error("s3:///prefix")
    assert "the prefix '../up' is not a valid object key" in one_line_config_error("s3://bucket/../up")


def test_refused_credentials_name_the_variables(monkeypatch):
    with running_s3(relay=False, checks_credentials=True) as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        message = one_line_config_error(server.url)
    assert "refused the credentials: check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (InvalidAccessKeyId" in message


def test_an_endpoint_gone_longer_than_the_outage_window_is_a_storage_error_and_the_objects_are_there_when_it_is_back(aws, monkeypatch):
    monkeypatch.setenv("FACTORY_STORE_OUTAGE_S", "0.5")
    store = open_store(f"{aws.url}/outage")
    etag = store.create("manifests/a.json", b"{}")
    aws.kill()
    try:
        with pytest.raises(StorageError, match=r"s3://factory-test/factory/outage/manifests/a.json: read failed at http://127\.0\.0\.1:\d+ ") as raised:
            store.get("manifests/a.json", limit=100)
        assert str(raised.value).endswith("still failing after 0.5 s of retries: rerun once it answers, or allow longer outages "
                                          "with FACTORY_STORE_OUTAGE_S (at most 100 s)")
        with pytest.raises(StorageError, match="create failed"):
            store.create("manifests/b.json", b"{}")
        with pytest.raises(StorageError, match=r"s3://factory-test/factory/outage/: list failed"):
            store.list()
    finally:
        aws.restart()
    assert store.get("manifests/a.json", limit=100).etag == etag
    assert store.list() == ["manifests/a.json"]


def test_an_endpoint_back_within_the_outage_window_costs_a_pause_not_an_error(aws, monkeypatch):
    monkeypatch.setenv("FACTORY_STORE_OUTAGE_S", "30")
    store = open_store(f"{aws.url}/pause")
    etag = store.create("manifests/a.json", b"{}")
    for request in (lambda: store.get("manifests/a.json", limit=100).etag == etag, lambda: store.create("manifests/b.json", b"{}") is not None):
        aws.kill()
        back = threading.Timer(1.5, aws.restart)
        back.start()
        cut = time.monotonic()
        try:
            assert request()
            assert time.monotonic() - cut >= 1.0  # it did wait for the endpoint (the kill is not a no-op)
        finally:
            back.join()
    assert store.list() == ["manifests/a.json", "manifests/b.json"]


def test_a_stage_opening_the_store_during_an_outage_waits_for_the_endpoint_and_a_command_does_not(aws, monkeypatch, tmp_path):
    """A command checks the store before any stage starts and says at once that it cannot reach it; a stage process
    (`open_registry(patient=True)`, as factory.runtime opens it) belongs to a run that found the store, so it waits
    the outage out as an open store does, and past the window says how long it waited."""
    from factory.registry import open_registry
    from resources import FactoryStores

    monkeypatch.setenv("FACTORY_STORE", f"{aws.url}/patient")
    monkeypatch.setenv("FACTORY_STORE_OUTAGE_S", "30")
    aws.kill()
    back = threading.Timer(1.5, aws.restart)
    try:
        assert "cannot reach" in one_line_config_error(f"{aws.url}/patient")
        back.start()
        cut = time.monotonic()
        registry = open_registry(tmp_path / "local", patient=True)
        assert time.monotonic() - cut >= 1.0  # opened once the endpoint was back
        assert registry.store.list() == ["layout.json"]  # the registry's, written once it was open
        aws.kill()  # a run's step (the Dagster resource) waits likewise
        back = threading.Timer(1.5, aws.restart)
        back.start()
        cut = time.monotonic()
        assert FactoryStores(root=str(tmp_path)).registry().store.list() == ["layout.json"]
        assert time.monotonic() - cut >= 1.0
        monkeypatch.setenv("FACTORY_STORE_OUTAGE_S", "0.5")
        back.join()
        aws.kill()
        with pytest.raises(StorageError) as raised:  # an outage, not a setting to change: exit 1
            open_store(f"{aws.url}/patient", patient=True)
        message = str(raised.value)
        assert raised.value.exit_code == 1 and "\n" not in message
        assert "cannot reach" in message and ", waited for 0.5 s: run again once it answers, or allow longer outages with " \
            "FACTORY_STORE_OUTAGE_S (" in message
    finally:
        back.cancel()
        if back.is_alive():
            back.join()
        if aws._relay.poll() is not None:
            aws.restart()


@pytest.mark.parametrize("value", ["soon", "-1", "101", "nan"])
def test_an_outage_window_that_is_not_seconds_up_to_100_names_the_setting(aws, monkeypatch, value):
    monkeypatch.setenv("FACTORY_STORE_OUTAGE_S", value)
    assert one_line_config_error(f"{aws.url}/window").startswith(f"FACTORY_STORE_OUTAGE_S={value!r}: give the seconds a store request is tried again")


def test_a_lease_holder_waiting_out_the_longest_outage_still_looks_alive():
    """A holder renews its lease every LEASE_HEARTBEAT_S; a renewal that waits out the longest outage lands before the
    others may take the lease over."""
    from factory.registry.lease import LEASE_HEARTBEAT_S, LEASE_STALE_S
    from factory.storage.s3 import MAX_OUTAGE_S

    assert LEASE_HEARTBEAT_S + MAX_OUTAGE_S < LEASE_STALE_S
