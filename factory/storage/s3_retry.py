"""How long the Iceberg warehouse's reads and writes wait for an S3 endpoint that went away: the store's outage window
(`FACTORY_STORE_OUTAGE_S`, factory/storage/s3.py), so a table read under a training rides out the same outage as its
checkpoints. pyiceberg's file IO reaches S3 through pyarrow, which builds this strategy from its import path with no
arguments (the `s3.retry-strategy-impl` property, which `S3Store.table_properties` sets)."""

from __future__ import annotations

import math
import os
import re

from pyarrow.fs import AwsDefaultS3RetryStrategy

from factory.errors import StorageError
from factory.storage.s3 import OUTAGE_SETTING, outage_window, still_failing

NETWORK_ERROR = re.compile(r"\bAWS Error (NETWORK_CONNECTION|SERVICE_UNAVAILABLE|SLOW_DOWN|INTERNAL_FAILURE|REQUEST_TIMEOUT|"
                           r"UNKNOWN \(HTTP status 5\d\d\))")
"""How pyarrow words an S3 request that failed on the way (its OSError's text, `AWS Error <code> during <operation>`),
after the strategy below ran out: the endpoint, not the request, was at fault."""
SCALE_S = 0.025
"""The AWS SDK's default strategy waits up to 2^k x 25 ms before its retry k (50 ms, 0.1 s, 0.2 s...: doubling); with the
window at 1 s its 4 retries gave up within 0.4 s here."""


def retries_within(window_s: float) -> int:
    """The most retries whose waits add up to at most `window_s` seconds (25 ms x (2^(n+1) - 2) for n), at least one."""
    return max(1, int(math.log2(window_s / SCALE_S + 2)) - 1)


class OutageRetry(AwsDefaultS3RetryStrategy):
    """pyarrow's default S3 retry strategy, with as many retries as fit in the outage window."""

    def __init__(self) -> None:
        super().__init__(max_attempts=retries_within(outage_window(os.environ.get(OUTAGE_SETTING, ""))))


def warehouse_outage(error: OSError) -> StorageError | None:
    """A warehouse request's OSError that says the S3 endpoint did not answer through the outage window, as the
    StorageError a store request says then (None for any other OSError: a path, a permission)."""
    if not NETWORK_ERROR.search(str(error)):
        return None
    window = outage_window(os.environ.get(OUTAGE_SETTING, ""))
    return StorageError(f"the warehouse's store did not answer: {error}; {still_failing(window)}")
