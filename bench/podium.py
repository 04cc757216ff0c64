"""Podium's table view on a million rows: page times through the real HTTP app vs. a naive scan per page, side by side.

A 1,000,000-row fine-tuning table (id, label, prompt, completion, metadata, score, bytes, sha256)
is built with vectorised pyarrow ops and written as one version; its build time is printed apart.
Then, in one process through `create_app` and Starlette's TestClient:
1. The first load of `/t/<table>`: every column read from Parquet into Podium's column cache.
2. Warm pages (each PAGE_REPEATS times; median and max): deep offsets, a filter on `label`, a sort on
   `score`, a sort + filter deep in its result, a `contains` filter on `prompt`, and one row view.
3. The naive way, without Podium's cache: pyiceberg `scan(snapshot_id=...).to_arrow()` of the whole
   snapshot, then filter / sort / slice in pyarrow, per page (median of NAIVE_REPEATS). Ratios
   podium / naive are printed for a plain, a filtered and a sorted page, after checking both
   sides show the same first row.
The goal is every warm page well under a second; the bench prints whether that holds and asserts nothing. `--smoke`:
10,000 rows, to check the bench runs.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from starlette.testclient import TestClient

from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.tables import TableVersion, write_version
from factory.podium.app import create_app

LOG = logging.getLogger("bench.podium")
TABLE = "sft.million"
ROWS = 1_000_000
SMOKE_ROWS = 10_000
SEED = 0
PAGE_SIZE = 50
PAGE_REPEATS = 5
NAIVE_REPEATS = 3
WARM_GOAL_MS = 1000.0
BASE_URL = "http://127.0.0.1:8765"  # the app only accepts loopback Host headers
LABELS = ("ok", "broken", "hostile", "huge", "duplicate")
LABEL_WEIGHTS = (0.80, 0.10, 0.04, 0.03, 0.03)
NEEDLE = "zebra"
"""A word in about 1% of prompts, for the `contains` filter."""
WORDS = ("return", "value", "index", "list", "dict", "assert", "lambda", "yield", "self", "count", "total", "items",
         "append", "range", "print", "result", "string", "number", "parse", "token", "buffer", "shape", "mean", "sum")
SCHEMA = pa.schema([
    pa.field("id", pa.string(), nullable=False),
    pa.field("label", pa.string(), nullable=False),
    pa.field("prompt", pa.string(), nullable=False),
    pa.field("completion", pa.string(), nullable=False),
    pa.field("metadata", pa.string(), nullable=False),
    pa.field("score", pa.int64(), nullable=False),
    pa.field("bytes", pa.int64(), nullable=False),
    pa.field("sha256", pa.string(), nullable=False),
])


def phrases(rng: np.random.Generator, count: int, low: int, high: int, needle_share: float = 0.0) -> pa.Array:
    """`count` distinct-ish phrases of `low` to `high` characters, from WORDS (a few with NEEDLE in them)."""
    out = []
    for i in range(count):
        words = [f"{WORDS[w]}_{i}" for w in rng.integers(0, len(WORDS), 40)]
        if rng.random() < needle_share:
            words[int(rng.integers(0, 5))] = NEEDLE
        out.append(" ".join(words)[: int(rng.integers(low, high + 1))])
    return pa.array(out, pa.string())


def pick(pool: pa.Array, rng: np.random.Generator, rows: int) -> pa.Array:
    return pool.take(pa.array(rng.integers(0, len(pool), rows)))


def hex_digests(rng: np.random.Generator, rows: int) -> pa.Array:
    """`rows` random 64-character hex strings (digest-shaped; the bench never checks them)."""
    data = rng.bytes(32 * rows).hex().encode()
    offsets = np.arange(0, 64 * (rows + 1), 64, dtype=np.int32)
    return pa.StringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(data))


def build_rows(rows: int) -> pa.Table:
    """The rows, built column by column (no Python loop over rows)."""
    rng = np.random.default_rng(SEED)
    numbers = pa.array(np.arange(rows)).cast(pa.string())
    ids = pc.binary_join_element_wise("s", pc.utf8_lpad(numbers, 7, "0"), "")
    heads = pc.binary_join_element_wise("def f", numbers, "(x):\n   ", "")
    body = [pick(phrases(rng, 3000, 25, 95, needle_share=0.01), rng, rows) for _ in range(3)]
    prompts = pc.binary_join_element_wise(heads, *body, " ")
    completions = pick(phrases(rng, 3000, 20, 80), rng, rows)
    sources = pa.array(["mined", "synthetic", "curated", "human"]).take(pa.array(rng.integers(0, 4, rows)))
    difficulty = pa.array(rng.integers(1, 6, rows)).cast(pa.string())
    metadata = pc.binary_join_element_wise('{"source": "', sources, '", "difficulty": ', difficulty, "}", "")
    labels = pa.array(LABELS).take(pa.array(rng.choice(len(LABELS), rows, p=LABEL_WEIGHTS)))
    sizes = pc.add(pc.binary_length(prompts.cast(pa.binary())), pc.binary_length(completions.cast(pa.binary()))).cast(pa.int64())
    columns = [ids, labels, prompts, completions, metadata, pa.array(rng.integers(0, 1_000_000_000, rows)), sizes, hex_digests(rng, rows)]
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def build_table(catalog: Catalog, count: int) -> TableVersion:
    started = time.perf_counter()
    rows = build_rows(count)
    built = time.perf_counter() - started
    version = write_version(catalog, TABLE, rows, LOG, schema=SCHEMA)
    written = time.perf_counter() - started - built
    print(f"build: {count:,} rows, {rows.nbytes / 1e6:.0f} MB in Arrow; generated in {built:.1f} s, "
          f"written as {version.ref} in {written:.1f} s (not part of the ratios)")
    return version


def get(client: TestClient, path: str) -> tuple[float, str]:
    """(milliseconds, html) of one GET; any status but 200 stops the bench."""
    started = time.perf_counter()
    response = client.get(path)
    elapsed = 1000 * (time.perf_counter() - started)
    if response.status_code != 200:
        sys.exit(f"GET {path} answered {response.status_code}: {response.text[:500]}")
    return elapsed, response.text


def timed(client: TestClient, path: str) -> tuple[float, float, str]:
    """(median ms, max ms, html) of PAGE_REPEATS GETs."""
    runs = [get(client, path) for _ in range(PAGE_REPEATS)]
    times = [ms for ms, _ in runs]
    return statistics.median(times), max(times), runs[-1][1]


def naive_page(catalog: Catalog, version: TableVersion, kind: str, offset: int) -> tuple[float, str]:
    """(ms, first id) of one page the naive way: scan the whole snapshot, then filter / sort / slice it."""
    started = time.perf_counter()
    data = catalog.load_table(TABLE).scan(snapshot_id=version.snapshot_id).to_arrow()
    if kind == "filtered":
        data = data.filter(pc.equal(data["label"], "broken"))
    elif kind == "sorted":
        data = data.sort_by([("score", "descending")])
    page = data.slice(offset, PAGE_SIZE)
    return 1000 * (time.perf_counter() - started), page["id"][0].as_py()


def naive(catalog: Catalog, version: TableVersion, kind: str, offset: int) -> tuple[float, str]:
    """(median ms, first id) of NAIVE_REPEATS naive pages."""
    runs = [naive_page(catalog, version, kind, offset) for _ in range(NAIVE_REPEATS)]
    return statistics.median(ms for ms, _ in runs), runs[0][1]


def warm_pages(client: TestClient, base: str, rows: int) -> dict[str, tuple[float, float, str]]:
    """(median ms, max ms, html) of each warm page of a table of `rows` rows, printed as it is measured."""
    middle, last, deep, row = rows // 2, rows - PAGE_SIZE, rows // 20, rows * 654321 // ROWS
    pages = {
        "first page": base,
        f"page at {middle:,}": f"{base}?offset={middle}&size={PAGE_SIZE}",
        f"last page ({last:,})": f"{base}?offset={last}&size={PAGE_SIZE}",
        "filtered label=broken": f"{base}?fc=label&fo=%3D&fv=broken&size={PAGE_SIZE}",
        "sorted score desc": f"{base}?sort=score&desc=1&size={PAGE_SIZE}",
        f"sorted + filtered at {deep:,}": f"{base}?sort=score&desc=1&fc=label&fo=%3D&fv=broken&offset={deep}&size={PAGE_SIZE}",
        f"prompt contains {NEEDLE!r}": f"{base}?fc=prompt&fo=contains&fv={NEEDLE}&size={PAGE_SIZE}",
        f"row view /row/{row}": f"{base}/row/{row}",
    }
    warm = {}
    for label, path in pages.items():
        warm[label] = timed(client, path)
        print(f"warm: {label:<30} median {warm[label][0]:7.1f} ms, max {warm[label][1]:7.1f} ms  ({path})")
    return warm


def against_naive(catalog: Catalog, version: TableVersion, warm: dict[str, tuple[float, float, str]], rows: int) -> None:
    """Ratios podium / naive scan for a plain, a filtered and a sorted page, once both show the same first row."""
    middle = rows // 2
    compared = {"plain": (f"page at {middle:,}", middle), "filtered": ("filtered label=broken", 0), "sorted": ("sorted score desc", 0)}
    for kind, (label, offset) in compared.items():
        naive_ms, first_id = naive(catalog, version, kind, offset)
        if f">{first_id}<" not in warm[label][2]:
            sys.exit(f"{kind} page: the naive scan's first row {first_id} is not on Podium's page; the two sides differ")
        podium_ms = warm[label][0]
        print(f"{kind} page: podium {podium_ms:.0f} ms, naive scan {naive_ms:.0f} ms, ratio {podium_ms / naive_ms:.3f} "
              f"(podium median of {PAGE_REPEATS} over HTTP, naive median of {NAIVE_REPEATS})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_ROWS:,} rows: checks the bench runs")
    rows = SMOKE_ROWS if parser.parse_args().smoke else ROWS
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        catalog = open_catalog(CatalogConfig.local(root / "iceberg"))
        version = build_table(catalog, rows)
        base = f"/t/{TABLE}"
        with TestClient(create_app(root), base_url=BASE_URL) as client:
            cold, _ = get(client, base)
            print(f"first load: {base} in {cold:.0f} ms (every column read from Parquet into the cache)")
            warm = warm_pages(client, base, rows)
        against_naive(catalog, version, warm, rows)
    slowest = max(warm, key=lambda k: warm[k][1])
    verdict = "yes" if warm[slowest][1] < WARM_GOAL_MS else "NO"
    print(f"every warm page under {WARM_GOAL_MS / 1000:.0f} s after the first load: {verdict} "
          f"(slowest: {slowest}, max {warm[slowest][1]:.0f} ms; first load {cold:.0f} ms)")
    print(f"bench run time: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
