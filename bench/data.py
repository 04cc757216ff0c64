"""Near dedup on Daft against the per-document loop it replaced, side by side in one run (`make bench`).

The corpus is real code nobody here wrote: every `.py` file of this virtualenv (about 21,000 files, 300 MB), or `--copies`
of it under other ids. Each side runs in a fresh process, one after the other:
- the loop: datasketch one document at a time (`factory.data.dedup.reference_near_duplicates`), on one core;
- the engine (`factory.data.minhash.near_duplicates`) on Daft's native runner with 1 and with 2 threads (a process sets
  its runner's threads once).
Printed: documents per second of each, the engine's speed-up over the loop, whether both removed the same documents
(the Jaccard of the removed-id sets), and each process's peak resident memory.

`--smoke`: the json package only.
"""

import argparse
import json
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SIDES = {"loop": None, "engine, 1 thread": 1, "engine, 2 threads": 2}


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
    threads = SIDES[name]
    if threads is not None:
        import daft

        daft.set_runner_native(num_threads=threads)
    started = time.perf_counter()
    removed = reference_near_duplicates(table, config, 0) if threads is None else near_duplicates(table, config, 0)
    seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out.write_text(json.dumps({"documents": table.num_rows, "seconds": seconds, "peak_mb": peak_mb, "removed": sorted(removed)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the json package only: checks the bench runs")
    parser.add_argument("--copies", type=int, default=1, help="the corpus this many times, under other ids (default 1)")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side is not None:
        from factory.runtime.report import exit_now

        side(args.side, args.smoke, args.copies, args.out)
        exit_now(0)  # as a stage ends: Daft's native threads can still be releasing Python objects while an interpreter finalizes (SIGABRT)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        for name in SIDES:
            out = Path(tmp) / "out.json"
            subprocess.run([sys.executable, __file__, "--side", name, "--copies", str(args.copies), "--out", str(out),
                            *(["--smoke"] if args.smoke else [])], check=True)
            results[name] = json.loads(out.read_text())
    loop = results["loop"]
    print(f"near dedup of {loop['documents']:,} documents ({args.copies} x the corpus), MinHash LSH at the default settings:")
    for name, result in results.items():
        rate = result["documents"] / result["seconds"]
        print(f"  {name:18} {result['seconds']:7.2f} s  {rate:8,.0f} documents/s  peak RSS {result['peak_mb']:6,.0f} MB  "
              f"removed {len(result['removed']):,}")
    for name in list(SIDES)[1:]:
        mine, theirs = set(results[name]["removed"]), set(loop["removed"])
        jaccard = len(mine & theirs) / len(mine | theirs) if mine | theirs else 1.0
        print(f"ratio {name} / loop: {loop['seconds'] / results[name]['seconds']:.2f}x faster; removed-set Jaccard {jaccard:.4f}")


if __name__ == "__main__":
    main()
