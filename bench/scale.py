"""Listing a registry's manifests at a lab's size: from its index vs from the manifest files, side by side (`make bench`).

A registry is filled with N manifests of a lab's mix of kinds (two in three evaluation results; pretrain, SFT and RL
runs, models, tokenizers and data versions for the rest), each naming its inputs, without artifact bytes: a listing
reads manifests only. For each size it prints, median of `--repeat` runs: the index's first build (every manifest read
once), a listing of the evaluation results from the index when nothing changed, the same after one new manifest, the
listing without the index (every manifest file opened and parsed, as before the index), and the index's size on disk.

`--smoke`: 300 manifests, 2 runs each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MIX = (("evaluations", 12), ("pretrain", 1), ("sft", 1), ("rl", 1), ("model", 2), ("tokenizer", 1))
"""Kinds and their weights (of 18): two in three manifests are evaluation results."""


def fill(root: Path, count: int) -> None:
    """`count` manifests under `root/manifests`, written as the registry writes them."""
    from factory.registry.store import Manifest, Provenance

    (root / "manifests").mkdir(parents=True)
    kinds = [kind for kind, weight in MIX for _ in range(weight)]
    for i in range(count):
        kind = kinds[i % len(kinds)]
        digest = f"{i:064x}"
        manifest = Manifest.new(kind=kind, fingerprint=f"{kind}-{i:08d}", digest=digest,
                                files={"result.json" if kind == "evaluations" else "model.pt": {"sha256": digest, "bytes": 100}},
                                config={"lr": 0.001 * (i % 7), "steps": 100}, inputs={"upstream": f"{max(i - 1, 0):064x}"},
                                code="local:0123456789abcdef",
                                provenance=Provenance(experiment=f"exp-{i % 1000}", config_hash="0" * 16, git_commit="f" * 40),
                                summary={"benchmark": "val_bpb", "value": 1.0 + i % 13 / 10} if kind == "evaluations" else {})
        (root / "manifests" / f"{manifest.fingerprint}.json").write_text(json.dumps(manifest.to_json(), indent=2, sort_keys=True))


def median_s(action: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(count: int, repeat: int) -> dict[str, float]:
    from factory.registry import ArtifactStore
    from factory.registry.index import INDEX_NAME, ManifestIndex
    from factory.registry.store import parse_manifest

    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        root = Path(tmp) / "registry"
        fill(root, count)
        store = ArtifactStore(root)
        index = ManifestIndex(root / INDEX_NAME, root / "manifests", store._indexed)

        def build() -> None:
            index.drop()
            list(index.bodies("evaluations"))

        def files() -> list:
            return [m for path in store.manifest_paths() if (m := store._read_or_warn(path)) is not None and m.kind == "evaluations"]

        figures = {"build": median_s(build, repeat), "files": median_s(files, repeat)}
        figures["index"] = median_s(lambda: list(store.manifests("evaluations")), repeat)

        def after_one_more() -> None:
            extra = root / "manifests" / "model-extra.json"
            body = parse_manifest(json.loads(next((root / "manifests").glob("model-*.json")).read_text())).to_json()
            extra.write_text(json.dumps({**body, "fingerprint": "model-extra"}))
            list(store.manifests("evaluations"))
            extra.unlink()

        figures["changed"] = median_s(after_one_more, repeat)
        figures["index_mb"] = (root / INDEX_NAME).stat().st_size / 1e6
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="300 manifests, 2 runs each: checks the bench runs")
    parser.add_argument("--sizes", default="1000,10000,100000", help="registry sizes, in manifests (default 1000,10000,100000)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each measure; the median is printed (default 5)")
    args = parser.parse_args()
    sizes, repeat = ([300], 2) if args.smoke else ([int(s) for s in args.sizes.split(",")], args.repeat)
    print("listing the evaluation results of a registry (2 in 3 manifests), median seconds:")
    print(f"{'manifests':>10} {'build index':>12} {'index':>8} {'1 changed':>10} {'files':>8} {'index MB':>9}  ratio files / index")
    for count in sizes:
        f = measure(count, repeat)
        print(f"{count:>10,} {f['build']:>12.3f} {f['index']:>8.3f} {f['changed']:>10.3f} {f['files']:>8.3f} {f['index_mb']:>9.1f}  "
              f"{f['files'] / f['index']:.1f}x")


if __name__ == "__main__":
    main()
