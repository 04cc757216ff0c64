"""The store's tests run on both backends: a local directory, and a prefix of its own on a real S3 server."""

import uuid

import pytest

from factory.storage import ObjectStore, open_store

BACKENDS = ("local", "s3")


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path, monkeypatch) -> ObjectStore:
    """An empty store: a directory under tmp_path, or a fresh prefix in the session's S3 server's bucket (the AWS
    variables that reach it are set for the test and the processes it starts)."""
    if request.param == "local":
        return open_store(tmp_path / "store")
    server = request.getfixturevalue("s3_server")
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    return open_store(f"s3://{server.bucket}/{uuid.uuid4().hex}")
