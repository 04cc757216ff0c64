"""`factory check` over 1,000 experiment files (each extends the tiny one, some sweep), timed in one run.

Prints the wall time for 1,000 files and the ratio to checking one file the same way, so the
per-file cost can be compared across machines. `--smoke`: 20 files, to check the bench runs.
"""

import argparse
import tempfile
import time
from pathlib import Path

from factory.preflight import check_files

TINY = Path(__file__).resolve().parents[1] / "experiments" / "tiny-code-lm.md"
FILES = 1000
SMOKE_FILES = 20


def write_configs(directory: Path, count: int) -> list[Path]:
    paths = []
    for i in range(count):
        sweep = "sweep:\n  pretrain.lr: [0.001, 0.002]\n" if i % 10 == 0 else ""
        front = f"extends: {TINY}\nseed: {i}\npretrain:\n  steps: {100 + i}\n{sweep}"
        path = directory / f"exp-{i:04d}.md"
        path.write_text(f"---\n{front}---\nVariant {i}.\n")
        paths.append(path)
    return paths


def timed(paths: list[Path]) -> float:
    started = time.perf_counter()
    reports = check_files(paths)
    elapsed = time.perf_counter() - started
    assert all(r.ok for r in reports), [r.errors for r in reports if not r.ok][:3]
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_FILES} files: checks the bench runs")
    files = SMOKE_FILES if parser.parse_args().smoke else FILES
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_configs(Path(tmp), files)
        timed(paths[:1])  # warm imports
        one = min(timed(paths[:1]) for _ in range(5))
        many = timed(paths)
    print(f"check {files} files: {many:.2f} s ({many / files * 1000:.2f} ms per file)")
    print(f"ratio {files} files / 1 file: {many / one:.0f}x (linear would be {files}x)")


if __name__ == "__main__":
    main()
