"""The store on S3 or any S3-compatible server (MinIO, Ceph, moto), through obstore (Rust's object_store).

obstore was chosen by measuring it beside boto3 and s3fs against one S3 server (bench/store_clients.py): the lowest
latency for the 1 KB objects the registry writes most (manifests, aliases, leases), downloads as fast or faster,
conditional writes both ways (s3fs offers only If-None-Match), a seekable reader built in, and no botocore to pin.

Settings are AWS's own variables: the endpoint from `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` (default: AWS), the
region from `AWS_REGION` or `AWS_DEFAULT_REGION`, credentials from `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`
(`AWS_SESSION_TOKEN`) or, without them, what obstore finds itself (a web identity token on Kubernetes, instance
metadata). Opening a store lists one key of its prefix, so that a missing bucket, an unreachable endpoint or refused
credentials is one ConfigError naming the setting to change, before any work starts. A stage process opens it
`patient`: its run checked the store when it began, so an endpoint that does not answer now is an outage, waited out
as below before the same error.

Once open, a store rides out an outage: a request that finds the endpoint gone (refused or dropped connections, 5xx,
timeouts of reads) is sent again with backoff for up to `FACTORY_STORE_OUTAGE_S` seconds (60 by default), so a
server restarting under a training run costs it a pause, not the run. Past that the request fails naming the setting.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import re
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import obstore
from obstore.exceptions import AlreadyExistsError, BaseError, PermissionDeniedError, PreconditionError, UnauthenticatedError
from obstore.store import S3Store as _ObstoreS3

from factory.errors import ArtifactError, ConfigError, StorageError, number_setting
from factory.storage.base import Blob, Listed, ObjectStore, Stat, check_key, too_large
from factory.storage.local import write_all, write_file_atomically

ENDPOINT_SETTINGS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
REGION_SETTINGS = ("AWS_REGION", "AWS_DEFAULT_REGION")
CREDENTIAL_SETTINGS = "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
DEFAULT_REGION = "us-east-1"
SHA256_METADATA = "sha256"
"""The user metadata (`x-amz-meta-sha256`) that holds the sha256 `upload` was given."""
PART_BYTES = 16 << 20
"""Upload part size: a file larger than this is uploaded in parts, several at once."""
PARTS_AT_ONCE = 8
READ_BUFFER_BYTES = 8 << 20
"""What `open_read` fetches per request (a range GET) and keeps."""
CONNECT_TIMEOUT = timedelta(seconds=5)
REQUEST_TIMEOUT = timedelta(minutes=10)
"""One request, its body included (a part, a range, a streamed download's whole body)."""
OUTAGE_SETTING, OUTAGE_S, MAX_OUTAGE_S = "FACTORY_STORE_OUTAGE_S", 60.0, 100.0
"""How long a request is retried while the endpoint does not answer (module docstring). At most 100 s: a lease's
holder renews it every 10 s and loses it after 120 s of silence (factory/registry/lease.py), so a holder waiting out an
outage must not look dead to the others."""
RETRIES_AT_OPEN = 1
"""The check at open retries once: an endpoint that does not answer then is a setting to fix, not an outage."""
BACKOFF = {"init_backoff": timedelta(seconds=0.1), "max_backoff": timedelta(seconds=4), "base": 2}
"""Retries 0.1 s, 0.2 s, 0.4 s... apart (with jitter), then every 4 s at most, until the outage window is spent."""
CONFLICT_TRIES, CONFLICT_PAUSE_S = 6, 0.05
"""A conditional write answered 409 ConditionalRequestConflict is sent this many times in all, pausing 0.05 s, 0.1 s,
0.2 s... between (`S3Store._conditional`)."""
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


@dataclass(frozen=True, kw_only=True, slots=True)
class S3Settings:
    """Where the S3 API is, read from the environment once, with the names of the settings it came from."""

    endpoint: str | None
    """None: AWS itself."""
    endpoint_setting: str
    region: str
    outage_s: float = OUTAGE_S
    """How long a request is retried while the endpoint does not answer (`FACTORY_STORE_OUTAGE_S`)."""

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> S3Settings:
        endpoint_setting = next((name for name in ENDPOINT_SETTINGS if environ.get(name)), ENDPOINT_SETTINGS[1])
        region = next((environ[name] for name in REGION_SETTINGS if environ.get(name)), DEFAULT_REGION)
        return cls(endpoint=environ.get(endpoint_setting) or None, endpoint_setting=endpoint_setting, region=region,
                   outage_s=outage_window(environ.get(OUTAGE_SETTING, "")))


TABLE_PROPERTIES = {"s3.endpoint": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"), "s3.region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
                    "s3.access-key-id": ("AWS_ACCESS_KEY_ID",), "s3.secret-access-key": ("AWS_SECRET_ACCESS_KEY",),
                    "s3.session-token": ("AWS_SESSION_TOKEN",)}
"""pyiceberg's S3 file IO property -> the AWS variables that give it, the first one set."""


class S3Store(ObjectStore):
    """Objects under `s3://bucket/prefix`; ETags are the server's, conditional writes are `If-None-Match`/`If-Match`."""

    def __init__(self, bucket: str, prefix: str, settings: S3Settings, *, retries: int | None = None) -> None:
        """`retries`: how many times a failed request is sent again, within the outage window; None: as many as fit."""
        self.bucket, self.prefix, self.settings = bucket, prefix, settings
        self.uri = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        endpoint = {"endpoint": settings.endpoint} if settings.endpoint else {}
        window = timedelta(seconds=settings.outage_s)
        self._store = _ObstoreS3(bucket, prefix=prefix or None, region=settings.region, **endpoint,
                                 client_options={"allow_http": (settings.endpoint or "").startswith("http://"),
                                                 "connect_timeout": CONNECT_TIMEOUT, "timeout": REQUEST_TIMEOUT},
                                 retry_config={"max_retries": (1 << 16) if retries is None else retries, "retry_timeout": window,
                                               "backoff": BACKOFF})

    @classmethod
    def table_properties(cls, uri: str) -> dict[str, str]:
        """pyiceberg's S3 file IO: the AWS variables that are set, and retries that wait out the outage window
        (`factory.storage.s3_retry`)."""
        found = {prop: next((os.environ[n] for n in names if os.environ.get(n)), "") for prop, names in TABLE_PROPERTIES.items()}
        return {**{prop: value for prop, value in found.items() if value}, "s3.retry-strategy-impl": "factory.storage.s3_retry.OutageRetry"}

    @classmethod
    def from_uri(cls, uri: str, setting: str, patient: bool = False) -> S3Store:
        """`s3://bucket/prefix`, checked against the server (module docstring); `patient`: an endpoint that does not
        answer is waited for within the outage window."""
        parts = urlsplit(uri)
        prefix = parts.path.strip("/")
        if not _BUCKET.fullmatch(parts.netloc) or parts.query or parts.fragment:
            raise ConfigError(f"{setting}={uri}: an S3 store is s3://bucket/prefix, with a bucket name of 3-63 characters "
                              f"(a-z, 0-9, '.', '-')")
        if prefix:
            try:
                check_key(prefix)
            except ArtifactError as e:
                raise ConfigError(f"{setting}={uri}: the prefix {e}") from e
        settings = S3Settings.from_environment(os.environ)
        cls(parts.netloc, prefix, settings, retries=None if patient else RETRIES_AT_OPEN)._check(setting, patient)
        return cls(parts.netloc, prefix, settings)

    def _check(self, setting: str, patient: bool) -> None:
        """Raise a ConfigError naming the setting to change unless the bucket answers a listing with these credentials
        (`patient`: the endpoint was waited for through the outage window, and one that still does not answer is a
        StorageError)."""
        where = self.settings.endpoint or f"AWS S3 ({self.settings.region})"
        try:
            next(iter(obstore.list(self._store, None, chunk_size=1)), None)
        except (PermissionDeniedError, UnauthenticatedError) as e:
            raise ConfigError(f"{setting}={self.uri}: {where} refused the credentials: check {CREDENTIAL_SETTINGS} "
                              f"({_reason(e)})") from e
        except BaseError as e:
            reason = _reason(e)
            if "NoSuchBucket" in str(e):
                raise ConfigError(f"{setting}={self.uri}: {where} has no bucket {self.bucket!r}: create it, or change {setting}") from e
            if re.search(r"PermanentRedirect|AuthorizationHeaderMalformed|\b301\b", str(e)):
                raise ConfigError(f"{setting}={self.uri}: the bucket {self.bucket!r} is in another region than "
                                  f"{self.settings.region}: check AWS_REGION ({reason})") from e
            if re.search(r"\b40[13]\b|InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied", str(e)):
                raise ConfigError(f"{setting}={self.uri}: {where} refused the credentials: check {CREDENTIAL_SETTINGS} "
                                  f"({reason})") from e
            if patient and _RETRIED.search(str(e)):  # a stage's run found the store when it began: an outage (exit 1)
                raise StorageError(f"{setting}={self.uri}: cannot reach {where}, waited for {self.settings.outage_s:g} s: run "
                                   f"again once it answers, or allow longer outages with {OUTAGE_SETTING} ({reason})") from e
            raise ConfigError(f"{setting}={self.uri}: cannot reach {where}: check {self.settings.endpoint_setting} ({reason})") from e

    def _get(self, key: str, limit: int) -> Blob | None:
        with self._request("read", key):
            try:
                result = obstore.get(self._store, key)
            except FileNotFoundError:
                return None
            if result.meta["size"] > limit:
                raise too_large(f"{self.uri}/{key}", result.meta["size"], limit)
            data = bytearray()
            for chunk in result.stream():  # bounded even if the body is longer than the server said
                data += chunk
                if len(data) > limit:
                    raise too_large(f"{self.uri}/{key}", len(data), limit)
        return Blob(bytes(data), _etag(result.meta, key))

    def _stat(self, key: str) -> Stat | None:
        with self._request("stat", key):
            try:
                result = obstore.get(self._store, key, options={"head": True})
            except FileNotFoundError:
                return None
        sha256 = result.attributes.get(SHA256_METADATA)
        return Stat(size=result.meta["size"], etag=_etag(result.meta, key),
                    sha256=sha256 if sha256 and re.fullmatch(r"[0-9a-f]{64}", sha256) else None,
                    modified=result.meta["last_modified"].timestamp())

    def _create(self, key: str, data: bytes) -> str | None:
        def write() -> str | None:
            try:
                return _etag(obstore.put(self._store, key, data, mode="create"), key)
            except AlreadyExistsError as e:
                if _conflict(e):
                    raise
                return None

        return self._conditional("create", key, write)

    def _replace(self, key: str, data: bytes, etag: str) -> str | None:
        def write() -> str | None:
            try:
                return _etag(obstore.put(self._store, key, data, mode={"e_tag": etag}), key)
            except (PreconditionError, FileNotFoundError):  # another version now, or none
                return None
            except AlreadyExistsError as e:
                if _conflict(e):
                    raise
                return None

        return self._conditional("replace", key, write)

    def _conditional(self, what: str, key: str, write: Callable[[], str | None]) -> str | None:
        """A conditional write, sent again while the server answers 409 ConditionalRequestConflict: S3's answer when
        another conditional write of the key is in flight, which writes nothing and decides nothing (obstore reports it
        as AlreadyExists, after retrying it itself on a replace). Only a 412 or an existing key means the write lost."""
        for tries in itertools.count(1):
            try:
                with self._request(what, key):
                    return write()
            except AlreadyExistsError as e:  # a 409: `write` returns every other outcome
                if tries == CONFLICT_TRIES:
                    raise StorageError(f"{self.uri}/{key}: {what} failed: the server answered 409 ConditionalRequestConflict "
                                       f"{tries} times (other writes of the key kept it busy): run it again") from e
                time.sleep(CONFLICT_PAUSE_S * 2 ** (tries - 1))

    def _put(self, key: str, data: bytes) -> str:
        with self._request("write", key):
            return _etag(obstore.put(self._store, key, data), key)

    def _upload(self, key: str, path: Path, sha256: str) -> str:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise ArtifactError(f"{path}: not a regular file: only a regular file can be uploaded")
        with self._request("upload", key):
            result = obstore.put(self._store, key, path, attributes={SHA256_METADATA: sha256}, chunk_size=PART_BYTES,
                                 max_concurrency=PARTS_AT_ONCE)
        return _etag(result, key)

    def _download(self, key: str, path: Path) -> None:
        with self._request("download", key):
            try:
                result = obstore.get(self._store, key)
            except FileNotFoundError:
                raise self.missing(key) from None

            def fill(fd: int) -> None:
                for chunk in result.stream(min_chunk_size=READ_BUFFER_BYTES):  # a body cut short is resumed by obstore
                    write_all(fd, chunk)

            write_file_atomically(path, fill)

    def _open_read(self, key: str) -> BinaryIO:
        with self._request("open", key):
            try:
                reader = obstore.open_reader(self._store, key, buffer_size=READ_BUFFER_BYTES)
            except FileNotFoundError:
                raise self.missing(key) from None
        return io.BufferedReader(_RangeReader(reader, self, key), buffer_size=io.DEFAULT_BUFFER_SIZE)

    def _list(self, prefix: str) -> dict[str, Listed]:
        directory = prefix.rpartition("/")[0]  # obstore lists by whole segments: the rest of the prefix is filtered here
        with self._request("list", prefix):
            metas = [meta for chunk in obstore.list(self._store, directory or None) for meta in chunk]
        return {meta["path"]: Listed(etag=_etag(meta, meta["path"]), size=meta["size"], modified=meta["last_modified"].timestamp())
                for meta in metas if meta["path"].startswith(prefix) and _valid(meta["path"])}

    def _delete(self, key: str) -> None:
        with self._request("delete", key):
            obstore.delete(self._store, key)

    @contextlib.contextmanager
    def _request(self, what: str, key: str) -> Iterator[None]:
        """obstore's failures (after its retries) as StorageError naming the store, the key and the settings to check."""
        try:
            yield
        except (PermissionDeniedError, UnauthenticatedError) as e:
            raise StorageError(f"{self.uri}/{key}: {what} refused: check {CREDENTIAL_SETTINGS} ({_reason(e)})") from e
        except (FileNotFoundError, AlreadyExistsError, PreconditionError):
            raise  # outcomes the hooks handle
        except BaseError as e:
            where = self.settings.endpoint or "AWS S3"
            waited = f"; {still_failing(self.settings.outage_s)}" if _RETRIED.search(str(e)) else ""
            raise StorageError(f"{self.uri}/{key}: {what} failed at {where} ({_reason(e)}){waited}") from e


class _RangeReader(io.RawIOBase):
    """obstore's seekable reader (range GETs, buffered) as a raw binary file: obstore's returns its own Bytes type, which
    torch.load does not take."""

    def __init__(self, reader, store: S3Store, key: str) -> None:
        self._reader, self._store, self._key = reader, store, key

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        with self._store._request("read", self._key):
            data = self._reader.read(len(buffer))
        count = len(data)
        memoryview(buffer).cast("B")[:count] = memoryview(data)
        return count

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._reader.seek(offset, whence)

    def tell(self) -> int:
        return self._reader.tell()

    def close(self) -> None:
        if not self.closed:
            self._reader.close()
        super().close()


def _etag(meta: Mapping, key: str) -> str:
    etag = meta.get("e_tag")
    if not etag:
        raise StorageError(f"{key}: the server sent no ETag, which conditional writes need: this S3 server cannot hold the store")
    return etag


def still_failing(window_s: float) -> str:
    """What a request that failed through the whole outage window says after its own words."""
    return (f"still failing after {window_s:g} s of retries: rerun once it answers, or allow longer outages with {OUTAGE_SETTING} "
            f"(at most {MAX_OUTAGE_S:g} s)")


def outage_window(text: str) -> float:
    """`FACTORY_STORE_OUTAGE_S` as seconds: the default when empty, else a number of seconds from 0 to MAX_OUTAGE_S."""
    return number_setting(OUTAGE_SETTING, text, default=OUTAGE_S, low=0, high=MAX_OUTAGE_S,
                          says=f"give the seconds a store request is tried again while the endpoint does not answer, from 0 to "
                               f"{MAX_OUTAGE_S:g} (default {OUTAGE_S:g})")


_RETRIED = re.compile(r"\bafter [1-9]\d* retr(y|ies)\b")
"""obstore's words for a request it sent again until its retries or the outage window ran out."""


def _valid(key: str) -> bool:
    """Whether a listed key is one the store could have written (another writer may leave others in the bucket)."""
    try:
        check_key(key)
    except ArtifactError:
        return False
    return True


def _reason(error: BaseException) -> str:
    """What went wrong, from obstore's message: the server's error code and message when it sent one, else the end of
    the message's first line (after the request and its retries), never the debug dump that follows."""
    text = str(error)
    code, message = re.search(r"<Code>([^<]*)</Code>", text), re.search(r"<Message>([^<]*)</Message>", text)
    if code:
        return f"{code[1]}: {message[1]}" if message else code[1]
    first = text.strip().splitlines()[0]
    return first.rpartition(" - ")[2][:200] if " - " in first else first[:200]


def _conflict(error: BaseError) -> bool:
    """Whether the server answered 409 ConditionalRequestConflict (`S3Store._conditional`)."""
    return "ConditionalRequestConflict" in str(error)
