"""Near dedup on Daft against the per-document loop it replaced, side by side in one run (`make bench`).

The corpus is real code nobody here wrote: every `.py` file of this virtualenv (about 21,000 files, 300 MB), or `--copies`
of it under other ids. Each side runs in a fresh process, one after the other:
- the loop: datasketch one document at a time (`factory.data.dedup.reference_near_duplicates`), on one core;
- the engine (`factory.data.minhash.near_duplicates`) on Daft's native runner on 1 and on 2 cores (the process pinned
  to them, its runner's threads as many: a process sets them once);
- Ray Data, the other engine the data stages could have been built on: datasketch's signatures made in `map_batches` by
  2 workers of a Ray started by the side, the bands grouped in its driver.
Printed: documents per second of each, the engine's speed-up over the loop, whether both removed the same documents
(the Jaccard of the removed-id sets), and each process's peak resident memory (for Ray Data, its driver's: its workers
are processes of the Ray it started).

Then the raw and dedup stages' memory, which must not grow with the corpus. Raw: a source directory of hard links to
the same files 1x and 4x, ingested by a fresh process the way the stage does it (`streamed`: spilled to a file, its keys
kept, written a batch at a time) and the way it did before (`whole`: every document in one table, then written); then
the same documents as records, JSONL files of 2,000 lines, whose ids are known only once read (the path that merges the
spill in id order, memory-mapped: its pages count in the process's resident memory). Dedup:
the corpus written as a raw table, 1x and 4x (every
`.py` file of the interpreter's lib directory: its standard library and the packages installed beside it; the json
package under `--smoke`), deduplicated by a fresh
process the way the stage does it (`streamed`: the version read a record batch at a time, ids, hashes and signatures
kept, the kept rows written through pyiceberg's streaming overwrite) and the way it did before (`whole`: the version read
into one table, deduplicated, written). Printed: each process's peak resident memory, and its growth from 1x to 4x.

Last, what near dedup itself holds while it runs, over many short documents (30 words of a 5,000-word vocabulary
each, made up: their signatures, half a kilobyte a document, outweigh their text), 100,000 and 400,000 of them: a fresh
process's peak resident memory above what it held before near dedup started, with the signatures waiting for their
bands in files as the stage keeps them (what grows with the documents is then the group-by of one band at a time: its
values and every document's id), and held in the process as near dedup kept them before.

`--smoke`: the json package only, the engine on one thread only, and 2,000 short documents.
"""

import argparse
import json
import os
import resource
import secrets
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.raycluster import auth  # noqa: E402  (the tests' Ray token environment)

SIDES = {"loop": ("loop", 1), "engine, 1 thread": ("daft", 1), "engine, 2 threads": ("daft", 2), "ray data, 2 workers": ("ray", 2)}
"""Each side: what runs it and on how many threads or workers."""
SMOKE_SIDES = ("loop", "engine, 1 thread", "ray data, 2 workers")
"""The sides of `--smoke`: each engine once (the engine's second thread runs the same code)."""
MEMORY_SIDES = ("streamed", "whole")
MEMORY_COPIES = (1, 4)
"""Sizes of the corpus the stage's memory is measured at (`--smoke`: the first only, to check the two sides agree)."""
SHORT_DOCUMENTS = (100_000, 400_000)
"""How many made-up short documents near dedup's own memory is measured over (`--smoke`: a fiftieth of the first)."""
SHORT_SIDES = ("files", "held")
RECORDS_PER_FILE = 2000
"""Records per JSONL file of the records source the raw stage's memory is measured on."""
RECORD_FILE_BYTES = 64 << 20
"""The records source's `max_file_bytes`: its files (up to about 20 MB) are read, none skipped as too large."""


def resident_mb(field: str = "VmRSS") -> float:
    """This process's resident memory now (`VmHWM`: its peak since it started its program), from Linux's status."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(f"{field}:")) / 1024


def peak_resident_mb() -> float:
    """This process's peak resident memory since it started its program: Linux's VmHWM. Not `ru_maxrss`, which keeps
    the high-water mark of the process it was forked from (Linux carries it over `exec`): a side started by a parent that
    holds the 4x corpus would report the parent's memory."""
    try:
        return resident_mb("VmHWM")
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def corpus(smoke: bool, copies: int) -> pa.Table:
    """Columns `id` and `text` of every `.py` file under the corpus root, `copies` times under other ids."""
    root = Path(sysconfig.get_paths()["stdlib"]) / "json" if smoke else Path(sysconfig.get_paths()["purelib"])
    texts = {str(path.relative_to(root)): path.read_text(errors="replace") for path in sorted(root.rglob("*.py")) if path.is_file()}
    ids = [f"{copy}/{name}" for copy in range(copies) for name in texts]
    return pa.table({"id": ids, "text": [text for _ in range(copies) for text in texts.values()]})


def side(name: str, smoke: bool, copies: int, out: Path) -> None:
    """One side, in this process: its removed ids and figures into `out`."""
    from factory.config.data_sections import DedupConfig
    from factory.data.dedup import reference_near_duplicates
    from factory.data.minhash import near_duplicates

    table, config = corpus(smoke, copies), DedupConfig()
    engine, workers = SIDES[name]
    if engine == "daft":
        import daft

        # on `workers` cores: the runner's threads, and the chunks the stage signs at once (one a core it may run on)
        if hasattr(os, "sched_setaffinity"):  # Linux
            os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:workers])
        daft.set_runner_native(num_threads=workers)
    if engine == "ray":
        import ray

        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    started = time.perf_counter()
    if engine == "loop":
        removed = reference_near_duplicates(table, config, 0)
    elif engine == "daft":
        removed = near_duplicates(table, config, 0)
    else:
        removed = ray_data_near_duplicates(table, config, 0, workers)
    seconds = time.perf_counter() - started
    peak_mb = peak_resident_mb()
    out.write_text(json.dumps({"documents": table.num_rows, "seconds": seconds, "peak_mb": peak_mb, "removed": sorted(removed)}))


def lib_files(smoke: bool) -> tuple[Path, list[Path]]:
    """The interpreter's lib directory (its json package under `smoke`) and its `.py` files, in order: the corpus of the
    memory sides."""
    root = Path(sysconfig.get_paths()["stdlib"]) / ("json" if smoke else "")
    return root, [path for path in sorted(root.rglob("*.py")) if path.is_file() and not path.is_symlink()]


def raw_table(smoke: bool, copies: int, catalog_dir: Path) -> int:
    """The `.py` files of the interpreter's lib directory (the json package's under `smoke`), `copies` times under other paths, written as
    the raw table `raw.code` of a catalog in `catalog_dir`; its snapshot id."""
    import hashlib

    from factory.data.catalog import CatalogConfig, open_catalog
    from factory.data.documents import ARROW_SCHEMA, doc_id
    from factory.data.tables import write_content

    root, files = lib_files(smoke)
    rows: dict[str, list] = {name: [] for name in ARROW_SCHEMA.names}
    for copy in range(copies):
        for path in files:
            data = path.read_bytes()
            name = f"{copy}/{path.relative_to(root)}"
            text = data.decode(errors="replace")
            for column, value in zip(ARROW_SCHEMA.names, (doc_id("code", name), "code", name, text, len(data), hashlib.sha256(data).hexdigest(), "{}"), strict=True):
                rows[column].append(value)
    catalog = open_catalog(CatalogConfig.local(catalog_dir))
    return write_content(catalog, "raw.code", pa.Table.from_pydict(rows, schema=ARROW_SCHEMA)).snapshot_id


def memory_side(name: str, catalog_dir: Path, snapshot_id: int, out: Path) -> None:
    """Deduplicate `raw.code` into `dedup.code` in this process, as the stage does (`streamed`) or as it did (`whole`)."""
    import logging

    from factory.config.data_sections import DedupConfig
    from factory.data.catalog import CatalogConfig, open_catalog
    from factory.data.dedup import deduplicate, find_duplicates
    from factory.data.documents import COLUMNS
    from factory.data.tables import read_version, stream_version, write_content
    from factory.stages.versions import Upstream

    catalog, config = open_catalog(CatalogConfig.local(catalog_dir)), DedupConfig()
    started = time.perf_counter()
    if name == "streamed":
        upstream = Upstream(columns=COLUMNS, rows=0, read=lambda columns: stream_version(catalog, "raw.code", snapshot_id, columns))
        found = find_duplicates(upstream.read, config, 0)
        version = write_content(catalog, "dedup.code", upstream.without(found.removed, found.keys))
        documents = found.keys.num_rows
    else:
        table = read_version(catalog, "raw.code", snapshot_id)
        version = write_content(catalog, "dedup.code", deduplicate(table, config, 0, logging.getLogger("bench")).documents)
        documents = table.num_rows
    seconds = time.perf_counter() - started
    peak_mb = peak_resident_mb()
    out.write_text(json.dumps({"documents": documents, "seconds": seconds, "peak_mb": peak_mb, "content_tag": version.content_tag}))


def linked_tree(smoke: bool, copies: int, into: Path) -> Path:
    """The `.py` files of the interpreter's lib directory (the json package's under `smoke`), `copies` times under other
    directories of `into`, as hard links (a copy where the disk refuses one): a source directory `copies` times the size."""
    import shutil

    root, files = lib_files(smoke)
    for copy in range(copies):
        for path in files:
            target = into / str(copy) / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)
            except OSError:
                shutil.copyfile(path, target)
    return into


def jsonl_tree(smoke: bool, copies: int, into: Path) -> Path:
    """The `.py` files of the interpreter's lib directory (the json package's under `smoke`), `copies` times, as records:
    JSONL files of up to RECORDS_PER_FILE lines `{"text": ...}` under `into` (a source of format `jsonl`, whose ids the raw
    stage knows only once it has read them: the path that merges its spill in id order)."""
    _, files = lib_files(smoke)
    into.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    written = 0

    def flush() -> None:
        nonlocal lines, written
        (into / f"part-{written:05d}.jsonl").write_text("".join(lines))
        lines, written = [], written + 1

    for _ in range(copies):
        for path in files:
            lines.append(json.dumps({"text": path.read_bytes().decode(errors="replace")}) + "\n")
            if len(lines) == RECORDS_PER_FILE:
                flush()
    if lines:
        flush()
    return into


def ingest_side(name: str, source: Path, catalog_dir: Path, out: Path, format: str = "text") -> None:  # noqa: A002
    """Ingest the directory `source` (files of `format`) into `raw.code` in this process, as the raw stage does
    (`streamed`: spilled, then written a batch at a time) or as it did (`whole`: every document gathered into one table,
    then written)."""
    import logging

    from factory.config.data_sections import SourceConfig
    from factory.data.catalog import CatalogConfig, open_catalog
    from factory.data.ingest import read_documents
    from factory.data.tables import write_content

    catalog = open_catalog(CatalogConfig.local(catalog_dir))
    records = {"include": ("**/*.jsonl",), "format": format, "max_file_bytes": RECORD_FILE_BYTES}  # shards of 2,000 documents
    config = SourceConfig(kind="directory", path=str(source), **({"include": ("**/*.py",)} if format == "text" else records))
    started = time.perf_counter()
    with read_documents("code", config, logging.getLogger("bench"), scratch=catalog_dir) as result:
        rows = result.documents if name == "streamed" else pa.Table.from_batches(list(result.documents.batches()))
        version = write_content(catalog, f"raw.{name}", rows)
    seconds = time.perf_counter() - started
    peak_mb = peak_resident_mb()
    out.write_text(json.dumps({"documents": version.rows, "seconds": seconds, "peak_mb": peak_mb, "content_tag": version.content_tag}))


def memory(smoke: bool) -> None:
    """The raw stage's peak memory (on files, then on records) and the dedup stage's, at 1x and 4x the corpus, streamed
    and whole, side by side."""
    sizes = MEMORY_COPIES[:1] if smoke else MEMORY_COPIES
    corpus = "the json package of the standard library" if smoke else "the interpreter's lib directory"
    for stage, flag in (("raw", "--ingest-side"), ("raw (JSONL records)", "--ingest-side"), ("dedup", "--memory-side")):
        results: dict[tuple[str, int], dict] = {}
        with tempfile.TemporaryDirectory(prefix="bench-data-memory-") as tmp:
            for copies in sizes:
                catalog_dir = Path(tmp) / f"catalog-{copies}"
                if stage == "raw":
                    where = ["--source", str(linked_tree(smoke, copies, Path(tmp) / f"source-{copies}"))]
                elif stage == "raw (JSONL records)":
                    where = ["--source", str(jsonl_tree(smoke, copies, Path(tmp) / f"records-{copies}")), "--format", "jsonl"]
                else:
                    where = ["--snapshot", str(raw_table(smoke, copies, catalog_dir))]
                for name in MEMORY_SIDES:
                    out = Path(tmp) / "out.json"
                    subprocess.run([sys.executable, __file__, flag, name, "--catalog", str(catalog_dir), *where, "--out", str(out)],
                                   check=True, env={**os.environ, "FACTORY_DATA_ROOTS": tmp})
                    results[name, copies] = json.loads(out.read_text())
        assert all(results["streamed", copies]["content_tag"] == results["whole", copies]["content_tag"] for copies in sizes), \
            f"the streamed {stage} stage wrote other rows than the whole-table one"
        print(f"the {stage} stage's peak memory ({corpus}, {' and '.join(f'{copies}x' for copies in sizes)}; the same rows written by both):")
        memory_table(results, sizes)


def memory_table(results: dict[tuple[str, int], dict], sizes: tuple[int, ...]) -> None:
    """Each side's documents, peak memory and seconds at each size, its growth, and the ratio of the two at the largest."""
    for name in MEMORY_SIDES:
        figures = "   ".join(f"{results[name, copies]['documents']:7,} documents {results[name, copies]['peak_mb']:6,.0f} MB "
                               f"in {results[name, copies]['seconds']:6.1f} s" for copies in sizes)
        growth = f"   ratio {sizes[-1]}x / {sizes[0]}x: {results[name, sizes[-1]]['peak_mb'] / results[name, sizes[0]]['peak_mb']:.2f}" \
            if len(sizes) > 1 else ""
        print(f"  {name:9} {figures}{growth}")
    print(f"ratio whole / streamed at {sizes[-1]}x: {results['whole', sizes[-1]]['peak_mb'] / results['streamed', sizes[-1]]['peak_mb']:.2f}x "
          "the memory")


def short_documents_side(count: int, held: bool, out: Path) -> None:
    """Near dedup over `count` made-up short documents, in this process: what it held above what the process held before
    (`held`: its signatures kept in this process until the bands, as near dedup kept them before they went to files)."""
    import contextlib
    import random

    from factory.config.data_sections import DedupConfig
    from factory.data import minhash

    class Held:
        def __init__(self) -> None:
            self.chunks: list[pa.Table] = []

        def add(self, signed: pa.Table) -> None:
            self.chunks.append(signed)

        def frame(self) -> object:
            import daft

            return daft.from_arrow(pa.concat_tables(self.chunks))

    @contextlib.contextmanager
    def held_signatures(scratch: Path | None = None) -> Iterator[Held]:
        yield Held()

    if held:
        minhash.kept_signatures = held_signatures
    pick = random.Random(0)
    vocabulary = [f"w{i}" for i in range(5000)]
    table = pa.table({"id": [f"{i:09d}" for i in range(count)], "text": [" ".join(pick.choices(vocabulary, k=30)) for _ in range(count)]})
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as refs:  # the peak so far forgotten (Linux):
        refs.write("5")  # from here on, near dedup's
    before, started = resident_mb(), time.perf_counter()
    removed = minhash.near_duplicates(table, DedupConfig(), 0)
    out.write_text(json.dumps({"documents": count, "seconds": time.perf_counter() - started, "above_mb": resident_mb("VmHWM") - before,
                               "removed": len(removed)}))


def short_documents(smoke: bool) -> None:
    """Near dedup's own peak memory over SHORT_DOCUMENTS, its signatures in files and held, a fresh process each."""
    results: dict[tuple[str, int], dict] = {}
    sizes = (SHORT_DOCUMENTS[0] // 50,) if smoke else SHORT_DOCUMENTS
    with tempfile.TemporaryDirectory(prefix="bench-data-short-") as tmp:
        for count in sizes:
            for name in SHORT_SIDES:
                out = Path(tmp) / "out.json"
                subprocess.run([sys.executable, __file__, "--short-side", str(count), *(["--held"] if name == "held" else []),
                                "--out", str(out)], check=True)
                results[name, count] = json.loads(out.read_text())
    assert len({result["removed"] for result in results.values()}) == 1, "both sides remove the same documents"
    print("near dedup's own peak memory over short made-up documents (30 words each), above what its process held before; "
          "its signatures in files (as the stage keeps them) or held in the process until the bands:")
    for name in SHORT_SIDES:
        figures = "   ".join(f"{results[name, count]['documents']:7,} documents {results[name, count]['above_mb']:5,.0f} MB "
                               f"in {results[name, count]['seconds']:5.1f} s" for count in sizes)
        growth = f"   ratio 4x / 1x: {results[name, sizes[-1]]['above_mb'] / results[name, sizes[0]]['above_mb']:.2f}" if len(sizes) > 1 else ""
        print(f"  {name:6} {figures}{growth}")
    print(f"ratio held / files at {sizes[-1]:,} documents: {results['held', sizes[-1]]['above_mb'] / results['files', sizes[-1]]['above_mb']:.2f}x the memory, "
          f"{results['held', sizes[-1]]['seconds'] / results['files', sizes[-1]]['seconds']:.2f}x the time")


def ray_data_near_duplicates(table: pa.Table, config: object, seed: int, workers: int) -> set[str]:
    """Near dedup on Ray Data: each document's datasketch signature made by `workers` Ray workers (`map_batches`), the
    documents whose bands collide grouped here, then swept in id order as the engine's are."""
    import numpy as np
    import ray
    from datasketch import MinHash

    from factory.data.dedup import shingles
    from factory.data.minhash import bands, swept

    num_perm, size = config.num_perm, config.shingle_tokens

    def sign(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        template = MinHash(num_perm=num_perm, seed=seed)
        signed = np.empty((len(batch["id"]), num_perm), np.uint64)
        for row, text in enumerate(batch["text"]):
            sketch = template.copy()
            sketch.update_batch(shingles(str(text), size))
            signed[row] = sketch.hashvalues
        return {"id": batch["id"], "signature": signed}

    count, rows = bands(config)
    colliding: dict[tuple, list[str]] = {}
    dataset = ray.data.from_arrow(table.select(["id", "text"])).map_batches(sign, batch_format="numpy", batch_size=256, concurrency=workers)
    for batch in dataset.iter_batches(batch_format="numpy", batch_size=4096):
        for document, signature in zip(batch["id"].tolist(), batch["signature"].tolist(), strict=True):
            for band in range(count):
                colliding.setdefault((band, *signature[band * rows:(band + 1) * rows]), []).append(document)
    return swept([ids for ids in colliding.values() if len(ids) > 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the json package only: checks the bench runs")
    parser.add_argument("--copies", type=int, default=1, help="the corpus this many times, under other ids (default 1)")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--memory-side", choices=MEMORY_SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--ingest-side", choices=MEMORY_SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--source", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--format", choices=("text", "jsonl"), default="text", help=argparse.SUPPRESS)
    parser.add_argument("--catalog", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--short-side", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--held", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.short_side is not None:
        from factory.launch.ending import exit_now

        short_documents_side(args.short_side, args.held, args.out)
        exit_now(0)
    if args.memory_side is not None or args.ingest_side is not None:
        from factory.launch.ending import exit_now

        if args.ingest_side is not None:
            ingest_side(args.ingest_side, args.source, args.catalog, args.out, args.format)
        else:
            memory_side(args.memory_side, args.catalog, args.snapshot, args.out)
        exit_now(0)
    if args.side is not None:
        from factory.launch.ending import exit_now

        side(args.side, args.smoke, args.copies, args.out)
        exit_now(0)  # as a stage ends: Daft's native threads can still be releasing Python objects while an interpreter finalizes (SIGABRT)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        for name in SMOKE_SIDES if args.smoke else SIDES:
            out = Path(tmp) / "out.json"
            # The Ray side's Ray takes a token of its own, set before Ray is imported: a local ray.init() would otherwise
            # write one to ~/.ray, which every later `ray start` on this machine would then require.
            token = auth(secrets.token_hex(32)) if SIDES[name][0] == "ray" else {}
            subprocess.run([sys.executable, __file__, "--side", name, "--copies", str(args.copies), "--out", str(out),
                            *(["--smoke"] if args.smoke else [])], check=True, env={**os.environ, **token})
            results[name] = json.loads(out.read_text())
    loop = results["loop"]
    print(f"near dedup of {loop['documents']:,} documents ({args.copies} x the corpus), MinHash LSH at the default settings:")
    for name, result in results.items():
        rate = result["documents"] / result["seconds"]
        print(f"  {name:19} {result['seconds']:7.2f} s  {rate:8,.0f} documents/s  peak RSS {result['peak_mb']:6,.0f} MB  "
              f"removed {len(result['removed']):,}")
    for name in list(results)[1:]:
        mine, theirs = set(results[name]["removed"]), set(loop["removed"])
        jaccard = len(mine & theirs) / len(mine | theirs) if mine | theirs else 1.0
        print(f"ratio {name} / loop: {loop['seconds'] / results[name]['seconds']:.2f}x faster; removed-set Jaccard {jaccard:.4f}")
    memory(args.smoke)
    short_documents(args.smoke)


if __name__ == "__main__":
    main()
