"""Which S3 client the store's backend uses, measured: boto3, obstore and s3fs against one S3 server, beside local disk.

Each client in turn, in one run, against the same moto server on 127.0.0.1 (tests/s3server.py): the median latency
of a 1 KB put and get (manifests, aliases and leases are that small), whether it can write only if absent
(`If-None-Match: *`) and only if the ETag still matches (`If-Match`), and 64 MB upload and download in MB/s. Each
figure also as a ratio to the same on local disk (factory.storage's local backend). The server (handling requests in
parallel, as `python -m moto.server` does) is in the loop for every client alike, so the differences between clients
are theirs; it closes the connection after each response, so every small request pays a new connection. `--smoke`: 10 small objects and 1 MB.
"""

import argparse
import importlib.util
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.s3server import CREDENTIALS, running_s3  # noqa: E402  (the tests' S3 server)

from factory.storage.local import LocalStore  # noqa: E402

SMALL_BYTES = 1024
MB = 1 << 20


class Local:
    """The baseline: factory.storage's local backend."""

    name = "local disk"

    def __init__(self, root: Path) -> None:
        self.store = LocalStore(root)

    def put(self, key: str, data: bytes) -> str:
        return self.store.put(key, data)

    def get(self, key: str) -> bytes:
        return self.store.get(key, limit=1 << 30).data

    def create(self, key: str, data: bytes) -> bool:
        return self.store.create(key, data) is not None

    def replace(self, key: str, data: bytes, etag: str) -> bool | None:
        return self.store.replace(key, data, etag) is not None

    def upload(self, key: str, path: Path) -> None:
        self.store.upload(key, path, sha256="0" * 64)

    def download(self, key: str, path: Path) -> None:
        self.store.download(key, path)


class Boto3:
    name = "boto3"

    def __init__(self, endpoint: str, bucket: str) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.exceptions import ClientError

        self.s3, self.bucket, self.ClientError = _boto3_client(boto3, endpoint), bucket, ClientError
        self.transfer = TransferConfig(multipart_threshold=16 * MB, multipart_chunksize=16 * MB, max_concurrency=8)

    def put(self, key: str, data: bytes) -> str:
        return self.s3.put_object(Bucket=self.bucket, Key=key, Body=data)["ETag"]

    def get(self, key: str) -> bytes:
        return self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def create(self, key: str, data: bytes) -> bool:
        return self._conditional(key, data, IfNoneMatch="*")

    def replace(self, key: str, data: bytes, etag: str) -> bool | None:
        return self._conditional(key, data, IfMatch=etag)

    def _conditional(self, key: str, data: bytes, **condition: str) -> bool:
        try:
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=data, **condition)
            return True
        except self.ClientError as e:
            if e.response["ResponseMetadata"]["HTTPStatusCode"] == 412:
                return False
            raise

    def upload(self, key: str, path: Path) -> None:
        self.s3.upload_file(str(path), self.bucket, key, Config=self.transfer)

    def download(self, key: str, path: Path) -> None:
        self.s3.download_file(self.bucket, key, str(path), Config=self.transfer)


class Obstore:
    name = "obstore"

    def __init__(self, endpoint: str, bucket: str) -> None:
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError
        from obstore.store import S3Store

        self.obstore, self.lost = obstore, (AlreadyExistsError, PreconditionError)
        self.store = S3Store(bucket, endpoint=endpoint, region=CREDENTIALS["AWS_REGION"], access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                             secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"], client_options={"allow_http": True})

    def put(self, key: str, data: bytes) -> str:
        return self.obstore.put(self.store, key, data)["e_tag"]

    def get(self, key: str) -> bytes:
        return bytes(self.obstore.get(self.store, key).bytes())

    def create(self, key: str, data: bytes) -> bool:
        return self._conditional(key, data, "create")

    def replace(self, key: str, data: bytes, etag: str) -> bool | None:
        return self._conditional(key, data, {"e_tag": etag})

    def _conditional(self, key: str, data: bytes, mode) -> bool:
        try:
            self.obstore.put(self.store, key, data, mode=mode)
            return True
        except self.lost:
            return False

    def upload(self, key: str, path: Path) -> None:
        self.obstore.put(self.store, key, path, chunk_size=16 * MB, max_concurrency=8)

    def download(self, key: str, path: Path) -> None:
        with open(path, "wb") as out:
            for chunk in self.obstore.get(self.store, key).stream(min_chunk_size=8 * MB):
                out.write(chunk)


class S3fs:
    name = "s3fs"

    def __init__(self, endpoint: str, bucket: str) -> None:
        import s3fs

        self.fs = s3fs.S3FileSystem(endpoint_url=endpoint, key=CREDENTIALS["AWS_ACCESS_KEY_ID"], secret=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                                    client_kwargs={"region_name": CREDENTIALS["AWS_REGION"]}, use_listings_cache=False, skip_instance_cache=True)
        self.bucket = bucket

    def put(self, key: str, data: bytes) -> str:
        return self.fs.pipe_file(f"{self.bucket}/{key}", data)["ETag"]

    def get(self, key: str) -> bytes:
        return self.fs.cat_file(f"{self.bucket}/{key}")

    def create(self, key: str, data: bytes) -> bool:
        try:
            self.fs.pipe_file(f"{self.bucket}/{key}", data, mode="create")
            return True
        except FileExistsError:
            return False

    def replace(self, key: str, data: bytes, etag: str) -> bool | None:
        return None  # s3fs writes with If-None-Match (mode="create") only; If-Match needs its botocore client directly

    def upload(self, key: str, path: Path) -> None:
        self.fs.put_file(str(path), f"{self.bucket}/{key}")

    def download(self, key: str, path: Path) -> None:
        self.fs.get_file(f"{self.bucket}/{key}", str(path))


def _boto3_client(boto3, endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, region_name=CREDENTIALS["AWS_REGION"], aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])


def median_ms(operation, count: int) -> float:
    """The median wall time of `operation(i)` over `count` calls (after three not counted), in milliseconds."""
    for i in range(3):
        operation(-1 - i)
    times = []
    for i in range(count):
        started = time.perf_counter()
        operation(i)
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def conditional_writes(client, tag: str) -> tuple[str, str]:
    """Whether `client` creates only if absent and replaces only if the ETag matches: ("yes" | "NO" | "not offered") twice."""
    created = client.create(f"cond/{tag}/create", b"first")
    refused = not client.create(f"cond/{tag}/create", b"second")
    kept = client.get(f"cond/{tag}/create") == b"first"
    etag = client.put(f"cond/{tag}/replace", b"v1")
    replaced = client.replace(f"cond/{tag}/replace", b"v2", etag)
    if replaced is None:
        return ("yes" if created and refused and kept else "NO"), "not offered"
    stale_refused = not client.replace(f"cond/{tag}/replace", b"v3", etag)
    return ("yes" if created and refused and kept else "NO"), ("yes" if replaced and stale_refused else "NO")


def throughput(client, tag: str, source: Path, target: Path, repeats: int) -> tuple[float, float]:
    """Best of `repeats` upload and download of `source`, in MB/s."""
    size_mb = source.stat().st_size / MB
    up, down = [], []
    for i in range(repeats):
        started = time.perf_counter()
        client.upload(f"big/{tag}/{i}", source)
        up.append(time.perf_counter() - started)
        target.unlink(missing_ok=True)
        started = time.perf_counter()
        client.download(f"big/{tag}/{i}", target)
        down.append(time.perf_counter() - started)
        assert hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(source.read_bytes()).digest(), f"{client.name}: download differs"
    return size_mb / min(up), size_mb / min(down)


def measure(client, tag: str, small: int, source: Path, target: Path, repeats: int) -> dict[str, float | str]:
    data = os.urandom(SMALL_BYTES)
    figures = {"put_ms": median_ms(lambda i: client.put(f"small/{tag}/{i}", data), small),
               "get_ms": median_ms(lambda i: client.get(f"small/{tag}/{max(i, 0)}"), small)}
    figures["create"], figures["replace"] = conditional_writes(client, tag)
    figures["upload"], figures["download"] = throughput(client, tag, source, target, repeats)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="10 small objects and 1 MB: checks the bench runs")
    smoke = parser.parse_args().smoke
    small, big_mb, repeats = (10, 1, 1) if smoke else (200, 64, 2)
    with tempfile.TemporaryDirectory() as tmp, running_s3(relay=False, parallel=True) as server:
        source, target = Path(tmp) / "source.bin", Path(tmp) / "target.bin"
        source.write_bytes(os.urandom(big_mb * MB))
        clients = [Local(Path(tmp) / "local"), Boto3(server.endpoint, server.bucket), Obstore(server.endpoint, server.bucket)]
        if importlib.util.find_spec("s3fs") is not None:  # not installed by `make setup`: its aiobotocore pins botocore
            clients.append(S3fs(server.endpoint, server.bucket))
        else:
            print("s3fs is not installed (pip install s3fs to measure it too)")
        results = {client.name: measure(client, client.name.replace(" ", "-"), small, source, target, repeats) for client in clients}
    local = results["local disk"]
    print(f"S3 clients against moto on 127.0.0.1 vs local disk: {SMALL_BYTES} B objects x {small}, {big_mb} MB x best of {repeats}")
    print(f"{'client':<11}{'put 1 KB':>20}{'get 1 KB':>20}{'create if absent':>18}{'replace if match':>18}"
          f"{f'upload {big_mb} MB':>22}{f'download {big_mb} MB':>22}")
    for name, f in results.items():
        print(f"{name:<11}{_figure(f['put_ms'], 'ms', f['put_ms'] / local['put_ms'], name):>20}"
              f"{_figure(f['get_ms'], 'ms', f['get_ms'] / local['get_ms'], name):>20}{f['create']:>18}{f['replace']:>18}"
              f"{_figure(f['upload'], 'MB/s', local['upload'] / f['upload'], name):>22}"
              f"{_figure(f['download'], 'MB/s', local['download'] / f['download'], name):>22}")
    print("(N.Nx): how many times slower than local disk (below 1: faster)")


def _figure(value: float, unit: str, slower: float, name: str) -> str:
    shown = f"{value:.2f} {unit}" if unit == "ms" else f"{value:.0f} {unit}"
    return shown if name == "local disk" else f"{shown} ({slower:.1f}x)"

if __name__ == "__main__":
    main()
