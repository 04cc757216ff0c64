"""The registry and the warehouse in an object store against the same on local disk, side by side in one run.

Against one moto server on 127.0.0.1 (tests/s3server.py, handling requests in parallel), beside local disk:
- a checkpoint-sized artifact (`--checkpoint-mb`): publish (upload) and open then read (on S3: download and verify every
  byte into the local copy first), in MB/s,
  `ObjectRegistry` on S3 against `ArtifactStore` on disk; then on S3 a load again from that verified local copy (the
  read-through cache) against streaming the bytes from the store and hashing them as they come, each time;
- a table of documents (`--documents`) streamed back as the training loader reads it, in MB/s of text, from a warehouse
  in the bucket against one on disk;
- one `lookup` (what `factory plan` asks of each stage) against a store holding 10, 100 and 1,000 artifacts: the
  requests it sends and its time, which must not grow with the number of artifacts (it reads no other manifest);
- a listing of every manifest of that store by a new reader, then from the local index it made;
- the plan of the tiny experiment, every stage cached, against the same: its requests and its time;
- on local disk, why the embedded default is its own registry (`ArtifactStore`) rather than `ObjectRegistry` over a
  local directory (`file://`, the seam's other backend): the same checkpoint published, opened and read, and looked up
  (a cached stage's question) by both.

`--smoke`: 2 MB, 200 documents, 10 and 30 artifacts.
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.s3server import running_s3  # noqa: E402  (the tests' S3 server)

from factory.data.catalog import CatalogConfig, open_catalog  # noqa: E402
from factory.data.tables import stream_version, write_version  # noqa: E402
from factory.registry import ArtifactStore, Provenance  # noqa: E402
from factory.registry.objects import ObjectRegistry  # noqa: E402
from factory.storage import open_store  # noqa: E402
from tests.data.conftest import LOG, documents  # noqa: E402

MB = 1 << 20
PROVENANCE = Provenance(experiment="bench", config_hash="0" * 16, git_commit="0" * 40)


def publish(registry, fingerprint: str, files: dict[str, bytes]):
    with registry.staging() as out:
        for name, data in files.items():
            (out / name).write_bytes(data)
        return registry.publish(out, kind="pretrain", fingerprint=fingerprint, config={}, inputs={}, code="bench",
                                provenance=PROVENANCE, summary={})


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def checkpoint(local: ArtifactStore, remote: ObjectRegistry, megabytes: int) -> None:
    files = {"step_000100.pt": os.urandom(megabytes * MB)}
    figures = {}
    for name, registry in (("local disk", local), ("s3", remote)):
        published = timed(lambda r=registry: publish(r, "fp-checkpoint", files))
        manifest = registry.lookup("fp-checkpoint")
        opened = timed(lambda r=registry, m=manifest: [p.read_bytes() for p in r.open(m.digest).iterdir()])  # as a load reads it
        figures[name] = (megabytes / published, megabytes / opened)
        print(f"checkpoint {megabytes} MB on {name}: publish {figures[name][0]:.0f} MB/s, open {figures[name][1]:.0f} MB/s")
    for i, what in enumerate(("publish", "open")):
        print(f"ratio checkpoint {what} s3 / local disk: {figures['s3'][i] / figures['local disk'][i]:.2f}x")
    reloads(remote, remote.lookup("fp-checkpoint"), megabytes, first=figures["s3"][1])


def on_disk(root: Path, megabytes: int, repeat: int = 200) -> None:
    """The local registry, which publishes by renaming the staged directory and serves an artifact where it lies, against
    the object-store registry over a local directory, which copies each file in (`upload`) and each artifact read into its
    cache (hashing it): the same checkpoint on the same disk, and the lookup a cached stage makes."""
    files = {"step_000100.pt": os.urandom(megabytes * MB)}
    sides = {"ArtifactStore": (ArtifactStore(root / "artifacts"), [root / "artifacts"]),
             "ObjectRegistry over file://": (ObjectRegistry(open_store(root / "objects"), root / "objects-local"),
                                             [root / "objects", root / "objects-local"])}
    figures = {}
    for name, (registry, directories) in sides.items():
        published = timed(lambda r=registry: publish(r, "fp-checkpoint", files))
        digest = registry.lookup("fp-checkpoint").digest
        opened = timed(lambda r=registry: [p.read_bytes() for p in r.open(digest).iterdir()])
        looked = timed(lambda r=registry: [r.lookup("fp-checkpoint") for _ in range(repeat)]) / repeat
        held = sum(p.stat().st_size for directory in directories for p in directory.rglob("*") if p.is_file())
        figures[name] = (published, opened, looked)
        print(f"local disk, {name}: publish {megabytes / published:.0f} MB/s, open and read {megabytes / opened:.0f} MB/s, "
              f"lookup {looked * 1000:.2f} ms, {held / MB:.0f} MB on disk")
    ours, theirs = figures["ArtifactStore"], figures["ObjectRegistry over file://"]
    print(f"ratio on local disk ObjectRegistry over file:// / ArtifactStore: publish {theirs[0] / ours[0]:.1f}x time, "
          f"open and read {theirs[1] / ours[1]:.1f}x time, lookup {theirs[2] / ours[2]:.1f}x time")


def reloads(remote: ObjectRegistry, manifest, megabytes: int, first: float) -> None:
    """Why checkpoints in the store are read through a local cache rather than streamed each time: a load again of the
    same checkpoint (an evaluation batch per benchmark, Podium's next generation) from the verified local copy, against
    streaming its bytes from the store each time (read as they arrive and hashed, as a verified stream would be)."""
    import hashlib

    def stream() -> None:
        for name in manifest.files:
            digest, reader = hashlib.sha256(), remote.store.open_read(f"objects/{manifest.digest}/{name}")
            with reader:
                while chunk := reader.read(8 * MB):
                    digest.update(chunk)
            assert digest.hexdigest() == manifest.files[name]["sha256"]

    again = megabytes / min(timed(lambda: [p.read_bytes() for p in remote.open(manifest.digest).iterdir()]) for _ in range(3))
    streamed = megabytes / min(timed(stream) for _ in range(3))
    print(f"checkpoint {megabytes} MB on s3 loaded again: from the local cache {again:.0f} MB/s, streamed and hashed {streamed:.0f} MB/s "
          f"(first load, fetched into the cache and verified: {first:.0f} MB/s)")
    print(f"ratio checkpoint load again from the cache / streamed: {again / streamed:.1f}x; first load through the cache / streamed: "
          f"{first / streamed:.2f}x")


def loader(root: Path, url: str, count: int) -> None:
    texts = {f"doc{i:06d}.py": f"def f{i}(x):\n    return x * {i}\n" * 40 for i in range(count)}
    rates = {}
    for name, store in (("local disk", ""), ("s3", url)):
        os.environ["FACTORY_STORE"] = store
        catalog = open_catalog(CatalogConfig.at(root / name.replace(" ", "-")))
        version = write_version(catalog, "filtered.bench", documents("bench", texts), LOG)
        size = [0]

        def read(c=catalog, v=version):
            size[0] = sum(sum(len(t) for t in b.column("text").to_pylist()) for b in stream_version(c, "filtered.bench", v.snapshot_id, ("text",)))

        seconds = min(timed(read) for _ in range(3))  # the first read of each also pays for opening pyiceberg's file IO
        rates[name] = size[0] / MB / seconds
        print(f"loader on {name}: {size[0] / MB:.1f} MB of text in {seconds:.2f} s, {rates[name]:.1f} MB/s")
    os.environ.pop("FACTORY_STORE")
    print(f"ratio loader s3 / local disk: {rates['s3'] / rates['local disk']:.2f}x")


class Counted:
    """An object store that counts the requests made through it."""

    def __init__(self, store) -> None:
        self.store, self.requests = store, 0

    def __getattr__(self, name):
        method = getattr(self.store, name)
        if not callable(method):
            return method

        def counted(*args, **kwargs):
            self.requests += 1
            return method(*args, **kwargs)

        return counted


def lookups(url: str, local: Path, sizes: list[int]) -> None:
    counted = Counted(open_store(url))
    registry = ObjectRegistry(counted, local)
    published, first, figures = 0, None, []
    for size in sizes:
        while published < size:
            manifest = publish(registry, f"fp-{published:06d}", {"result.json": f'{{"n": {published}}}'.encode()})
            first = first or manifest
            published += 1
        registry.lookup(first.fingerprint)  # its ETags recorded: a warm hit, as plan sees it
        counted.requests = 0
        seconds = min(timed(lambda: registry.lookup(first.fingerprint)) for _ in range(5))
        figures.append((counted.requests // 5, seconds))
        print(f"lookup among {size} artifacts: {figures[-1][0]} requests, {seconds * 1000:.1f} ms")
    (few, fast), (many, slow) = figures[0], figures[-1]
    print(f"ratio lookup among {sizes[-1]} / among {sizes[0]} artifacts: {slow / fast:.2f}x time, {many} / {few} requests")
    listings(counted, local, published)


def listings(counted: Counted, local: Path, count: int) -> None:
    """Every manifest listed (what the leaderboard, lineage and Podium ask for): by a reader with no local index yet
    (a LIST, then a GET of each manifest) and again once its index holds them (a LIST)."""
    first = ObjectRegistry(counted, local / "fresh-reader")
    counted.requests = 0
    cold = timed(lambda: list(first.manifests()))
    cold_requests, counted.requests = counted.requests, 0
    warm = min(timed(lambda: list(first.manifests())) for _ in range(5))
    warm_requests = counted.requests // 5
    print(f"listing {count} manifests: first {cold_requests} requests, {cold * 1000:.0f} ms; from the index {warm_requests} "
          f"requests, {warm * 1000:.0f} ms")
    print(f"ratio listing first / from the index: {cold / warm:.1f}x time, {cold_requests} / {warm_requests} requests")


def plans(url: str, local: Path, sizes: list[int]) -> None:
    """`build_plan` of the tiny experiment, every stage cached (a stand-in artifact published under each fingerprint),
    against a store that also holds `size` other artifacts."""
    from factory.config import load, plan_stage, stages_of, upstream_of
    from factory.ops.plan import build_plan

    experiment = load(Path(__file__).resolve().parents[1] / "experiments" / "tiny-code-lm.md")
    counted = Counted(open_store(url))
    registry = ObjectRegistry(counted, local)
    digests: dict[str, str] = {}
    for kind in stages_of(experiment):
        spec = plan_stage(experiment, kind, {name: digests[name] for name in upstream_of(experiment, kind)})
        digests[kind] = publish(registry, spec.fingerprint, {"stand-in.txt": kind.encode()}).digest
    published, figures = 0, []
    for size in sizes:
        while published < size:
            publish(registry, f"fp-other-{published:06d}", {"result.json": f'{{"n": {published}}}'.encode()})
            published += 1
        build_plan([experiment], registry)  # warm: the stamps of the stand-ins recorded
        counted.requests = 0
        seconds = timed(lambda: build_plan([experiment], registry))
        stages = len(digests)
        assert all(p.status == "cached" for p in build_plan([experiment], registry)), "every stage of the plan is cached"
        figures.append((counted.requests // 2, seconds))
        print(f"plan of {stages} cached stages among {size} other artifacts: {figures[-1][0]} requests, {seconds * 1000:.0f} ms")
    (few, fast), (many, slow) = figures[0], figures[-1]
    print(f"ratio plan among {sizes[-1]} / among {sizes[0]} other artifacts: {slow / fast:.2f}x time, {many} / {few} requests")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--checkpoint-mb", type=int, default=256)
    parser.add_argument("--documents", type=int, default=20_000)
    args = parser.parse_args()
    megabytes, count, sizes = (2, 200, [10, 30]) if args.smoke else (args.checkpoint_mb, args.documents, [10, 100, 1000])
    with running_s3(relay=False, parallel=True) as server, tempfile.TemporaryDirectory(prefix="bench-store-") as scratch:
        os.environ.update(server.env())
        root = Path(scratch)
        checkpoint(ArtifactStore(root / "disk"), ObjectRegistry(open_store(server.url), root / "s3-local"), megabytes)
        loader(root, server.url, count)
        lookups(f"s3://{server.bucket}/lookups", root / "lookups", sizes)
        plans(f"s3://{server.bucket}/plans", root / "plans", sizes)
        on_disk(root / "on-disk", megabytes)


if __name__ == "__main__":
    main()
