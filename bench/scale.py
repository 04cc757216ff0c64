"""The control plane at a lab's size (`make bench`): the factory's questions over a history of 1k to 100k manifests, each
history made once and reused.

A history of N manifests is one root, made without training anything (`make_history`): a registry of N manifests in
experiments of a lab's mix of kinds (`BLOCK`: two in three are evaluation results), each naming its inputs, without
artifact bytes (listings and lineage read manifests only), beside the tiny recipe's stages all published; a git
repository of N/100 experiment files that came in N/400 commits; and a Dagster instance on PostgreSQL recording the
registry's first N/10 checkpoints x 20 benchmarks, with the materializations of those checkpoints and of their
evaluation results in the registry, and a run of a backfill's shape.
With `--root DIR` the histories (DIR/<N>) and their PostgreSQL cluster (DIR/postgres) stay there and a later run reuses
them as they are; a history is made again only when its shape or `FORMAT` changed, or its make did not finish.

For each size it prints, median of `--repeat` runs: the index's first build (every manifest read once), a listing of
the evaluation results from the index when nothing changed, the same after one new manifest, the listing without the
index (every manifest file opened and parsed), the lineage of one model up and down (`factory lineage`'s questions),
the models made from the data every experiment shares (`factory lineage TABLE@tag`'s: the whole registry lies below
it), the leaderboard (`factory leaderboard`'s board, as kept while nothing changed, and after a new result, which
computes again only its experiment's entry), the dry run of `factory registry gc`, `factory plan` of one experiment
whose stages are all cached, Podium's generate list and the checkpoint a link names, and the index's size on disk;
over its Dagster instance, `factory evals backfill`'s planning (reading the checkpoints' records for the first time, and
again with them kept in the instance's cache of records, `assets.record_cache`), and the UI's asset pages and the page of the run of a
backfill's shape, asked of a Dagster webserver over HTTP as the browser asks them; the experiments sensor's tick at a
commit that changes one of its experiment files. Then how each figure grows with the size.

`--smoke`: a history of 90 manifests (5 files, 40 checkpoints), one run of each measure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from scale_history import BENCHMARK_PARTITIONS, BLOCK, SHARED_BLEND, git, history, publish_tiny  # noqa: E402  (bench/, the script's directory)
from tests.ports import free_port, serving, stopped  # noqa: E402


def median_s(action: Callable[[], object], repeat: int, before: Callable[[], object] = lambda: None,
             after: Callable[[], object] = lambda: None) -> float:
    """The median seconds of `action`, each run between `before` and `after` (not timed: what brings the registry to the
    state the action is measured at, and back)."""
    times = []
    for _ in range(repeat):
        before()
        try:
            started = time.perf_counter()
            action()
            times.append(time.perf_counter() - started)
        finally:
            after()
    return statistics.median(times)


def measure(root: Path, made: dict, repeat: int) -> dict[str, float]:
    """The registry's figures over the history at `root` (`make_history`'s record `made`). It is left as it was, but for
    the tiny recipe's stages at this code, published when the code changed since the history was made."""
    from factory.registry import ArtifactStore
    from factory.registry.index import INDEX_NAME
    from factory.registry.store import parse_manifest

    count = made["manifests"]
    registry = root / "registry"
    store = ArtifactStore(registry)
    index = store.index()

    def build() -> None:
        index.drop()
        list(index.bodies("evaluations"))

    def files() -> list:
        return [m for path in store.manifest_paths() if (m := store._read_or_warn(path)) is not None and m.kind == "evaluations"]

    figures = {"build": median_s(build, repeat), "files": median_s(files, repeat)}
    figures["index"] = median_s(lambda: list(store.manifests("evaluations")), repeat)

    def one_more(kind: str, **changes: str) -> Callable[[], None]:
        """Writes one more manifest of `kind` (a copy of one, `changes` made), as a publish would."""
        body = parse_manifest(json.loads(next((registry / "manifests").glob(f"*/{kind}-*.json")).read_text())).to_json()
        extra = store.manifest_path(f"{kind}-extra")
        return lambda: extra.write_text(json.dumps({**body, "fingerprint": f"{kind}-extra", **changes}))

    def gone(kind: str, then: Callable[[], object]) -> Callable[[], None]:
        """Removes the manifest `one_more` wrote, then `then` sees the registry as it was (not timed)."""
        def remove() -> None:
            store.manifest_path(f"{kind}-extra").unlink()
            then()

        return remove

    def listing() -> None:  # the evaluation results, after one more manifest of another kind
        list(store.manifests("evaluations"))

    figures["changed"] = median_s(listing, repeat, before=one_more("model"), after=gone("model", listing))

    def lineage() -> None:  # what `factory lineage` of the last experiment's RL model asks
        from factory.ops.lineage import Lineage

        graph = Lineage(store)
        [model] = [m for m in graph.find(f"exp-{count // len(BLOCK) - 1}") if m.inputs.get("rl")]
        graph.upstream(model.digest), graph.downstream(model.digest), graph.descendants(model.digest)

    figures["lineage"] = median_s(lineage, repeat)

    def trained_on() -> None:  # `factory lineage TABLE@tag`'s models: every model made, through any stages, from the data
        from factory.ops.lineage import Lineage

        assert len(Lineage(store).descendants(SHARED_BLEND, "model")) == 2 * (count // len(BLOCK))

    figures["trained_on"] = median_s(trained_on, repeat)

    def leaderboard() -> None:  # what `factory leaderboard` answers while nothing changed since its last board
        from factory.evals.publish import current_board

        assert len(current_board(store).rows) == count // len(BLOCK)

    leaderboard()  # the board kept for the history as it is (made now, the first time)
    figures["leaderboard"] = median_s(leaderboard, repeat)

    # a new result, asked for at once: its experiment's entry computed again, the rows merged
    new_result = one_more("evaluations", created=time.strftime("%Y-%m-%dT%H:%M:%S+00:00"))
    figures["board_changed"] = median_s(leaderboard, repeat, before=new_result, after=gone("evaluations", leaderboard))

    tiny = publish_tiny(store)  # the history's were published at the code it was made with: a change of code plans them anew

    def plan() -> None:  # `factory plan` of one experiment whose stages are all cached
        from factory.ops.plan import build_plan

        assert {p.status for p in build_plan([tiny], store)} == {"cached"}

    figures["plan"] = median_s(plan, repeat)
    weights = made["weights"]

    def podium() -> None:  # Podium's generate page's list, and the page a checkpoint link opens
        from factory.podium.generate import candidates, find_candidate

        candidates(store)
        assert find_candidate(store, weights) is not None

    podium()  # its imports (torch) are the server's start-up, not the page's
    figures["podium"] = median_s(podium, repeat)

    def gc_dry_run() -> None:  # `factory registry gc`'s dry run, no experiment file: whatever no alias or ref names
        from factory.ops.gc import plan_collection

        plan_collection(store, [], min_age_s=0)

    figures["gc"] = median_s(gc_dry_run, repeat)
    figures["index_mb"] = (registry / INDEX_NAME).stat().st_size / 1e6
    return figures


def sensor_tick(root: Path, made: dict, repeat: int) -> float:
    """The experiments sensor's tick at a commit that changes one of the history's experiment files, over its registry and
    its Dagster instance: median seconds of `repeat` ticks, each after a new such commit. The repository is put back at
    the history's commit afterwards."""
    from dagster import DagsterInstance, build_sensor_context

    from assets.sensors import experiments_at_head
    from resources import ExperimentFiles, FactoryStores

    repo = root / "repo"
    experiments = repo / "experiments"
    resources = {"experiments": ExperimentFiles(directory=str(experiments)), "stores": FactoryStores(root=str(root))}
    times = []
    with DagsterInstance.get() as instance:
        try:
            cursor = experiments_at_head(build_sensor_context(instance=instance, resources=resources)).cursor
            for round_ in range(repeat):
                (experiments / "e00000.md").write_text(f"---\nextends: base.md\nseed: {1000 + round_}\n---\nChanged.\n")
                git(repo, "commit", "-qam", f"change {round_}")
                started = time.perf_counter()
                result = experiments_at_head(build_sensor_context(instance=instance, cursor=cursor, resources=resources))
                times.append(time.perf_counter() - started)
                assert len(result.run_requests) == 1, result
                cursor = result.cursor
        finally:
            git(repo, "reset", "-q", "--hard", made["commit"])
    return statistics.median(times)


ASSET_PAGE = """
query AssetPage($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    ... on AssetNode {
      partitionStats { numMaterialized numPartitions numFailed numMaterializing }
      assetPartitionStatuses {
        __typename
        ... on MultiPartitionStatuses {
          primaryDimensionName
          ranges { primaryDimStartKey primaryDimEndKey secondaryDim { ... on DefaultPartitionStatuses { materializedPartitions } } }
        }
        ... on DefaultPartitionStatuses { materializedPartitions failedPartitions }
      }
    }
  }
}
"""
"""What the Dagster UI's asset page asks of the webserver for a partitioned asset: the counts and each partition's status."""
RUN_PAGE = """
query RunPage($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run {
      id status startTime endTime assetSelection { path } assets { key { path } }
      stats { __typename ... on RunStatsSnapshot { stepsSucceeded stepsFailed materializations } }
    }
  }
  logsForRun(runId: $runId, limit: 10000) {
    __typename
    ... on EventConnection {
      cursor hasMore
      events { __typename ... on MessageEvent { message timestamp level stepKey } ... on MaterializationEvent { assetKey { path } partition } }
    }
  }
}
"""
"""What the Dagster UI's page of a run asks of the webserver: the run, its stats and assets, and its event log."""


WEBSERVER_READY_S = 300.0
"""How long the webserver may take to start and load the code location (a loaded 2-core machine: about 10 s)."""


@contextlib.contextmanager
def webserver(home: Path) -> Iterator[Callable[[str, dict], dict]]:
    """The Dagster webserver on the instance at `home`, serving the factory's code location from a code server of its
    own, as `factory ui` serves it, on a free port of 127.0.0.1; yields `ask(query, variables)`, which posts one GraphQL
    query over HTTP, as the UI's pages do, and gives its data (GraphQL errors fail it). Stopped at the end."""
    port = free_port()

    def ask(query: str, variables: dict) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query, "variables": variables}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.loads(response.read())
        assert not answer.get("errors"), answer["errors"]
        return answer["data"]

    log = home / "webserver.log"
    with log.open("wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "dagster_webserver", "-h", "127.0.0.1", "-p", str(port), "-m", "assets.definitions"],
                                  cwd=ROOT, env={**os.environ, "DAGSTER_HOME": str(home)}, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        listed = lambda: ask("{ assetNodes { id } }", {})["assetNodes"]  # noqa: E731  (the code location is loaded)
        if not serving(listed, server, WEBSERVER_READY_S, 0.5, (urllib.error.URLError, ConnectionError, AssertionError)):
            sys.exit(f"the Dagster webserver did not start:\n{log.read_text()[-3000:]}")
        yield ask
    finally:
        stopped(server, 60)


def dagster_at_scale(root: Path, made: dict, repeat: int) -> dict[str, float]:
    """Over the history's Dagster instance (on PostgreSQL: its checkpoint partitions, each materialized once with the
    metadata a training stage records, `BENCHMARK_PARTITIONS` benchmarks, the checkpoints' results in the registry
    materialized as theirs), median seconds (the per-partition read of before: once) of: `factory evals backfill`'s
    planning (which checkpoints are still stored, read per partition as before and in chunks as now; which still lack a
    result; each with the instance's cache of records emptied before, and kept), and the Dagster UI's questions to its webserver, over HTTP (`webserver`): the asset page's (partition counts
    and statuses) for `evaluations` and `checkpoints`, the first since the webserver started and again, and the page of
    the history's run of a backfill's shape."""
    import warnings

    from dagster import DagsterInstance

    from assets.backfill import stored_checkpoints, unevaluated
    from assets.evaluations import EVALS_PER_RUN
    from assets.partitions import CHECKPOINTS
    from assets.record_cache import RecordCache
    from assets.records import latest_metadata
    from factory.registry import ArtifactStore

    warnings.filterwarnings("ignore")
    checkpoints, registry = made["checkpoints"], ArtifactStore(root / "registry")
    with DagsterInstance.get() as instance:
        keys = instance.get_dynamic_partitions(CHECKPOINTS)

        def per_partition() -> None:  # one query of the event log per checkpoint (before; timed once: tens of seconds)
            found = {key for key in instance.get_dynamic_partitions(CHECKPOINTS)
                     if (metadata := latest_metadata(instance, CHECKPOINTS, key)) and Path(metadata["path"]).exists()}
            assert len(found) == checkpoints

        def chunked() -> None:
            assert len(stored_checkpoints(instance)) == checkpoints

        def due() -> None:  # `factory run`'s question for an experiment's checkpoints, here all of them
            assert len(unevaluated(instance, registry, ["val_bpb"], set(keys))) == checkpoints

        forget = RecordCache.of(instance).remove  # the instance's cache of event-log records emptied: read as for the first time
        figures = {"before": median_s(per_partition, 1), "stored_first": median_s(chunked, repeat, before=forget),
                   "due_first": median_s(due, repeat, before=forget), "stored": median_s(chunked, repeat), "due": median_s(due, repeat)}
    with webserver(Path(os.environ["DAGSTER_HOME"])) as ask:
        def run_page() -> None:
            data = ask(RUN_PAGE, {"runId": made["run"]})
            assert data["runOrError"]["__typename"] == "Run", data["runOrError"]
            assert sum(e["__typename"] == "MaterializationEvent" for e in data["logsForRun"]["events"]) == min(EVALS_PER_RUN, checkpoints)

        figures["run"] = median_s(run_page, repeat)
        for asset in ("evaluations", "checkpoints"):
            def page(asset: str = asset) -> None:
                assert ask(ASSET_PAGE, {"key": {"path": [asset]}})["assetNodeOrError"]["partitionStats"]["numPartitions"]
            figures[f"{asset}_first"] = median_s(page, 1)
            figures[asset] = median_s(page, repeat)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a history of 90 manifests, one run each: checks the bench runs")
    parser.add_argument("--sizes", default="1000,10000,100000", help="history sizes, in manifests (default 1000,10000,100000)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each measure; the median is printed (default 5)")
    parser.add_argument("--root", type=Path, help="where the histories are made and kept, one per size (ROOT/<size>), with the "
                        "PostgreSQL cluster of their Dagster instances (ROOT/postgres): a later run reuses them (default: a "
                        "temporary directory, removed at the end)")
    parser.add_argument("--postgres", metavar="URL", help="a PostgreSQL server to keep the Dagster instances in, a database "
                        "per size, instead of a cluster of the bench's own")
    args = parser.parse_args()
    sizes, repeat = ([90], 1) if args.smoke else ([int(s) for s in args.sizes.split(",")], args.repeat)
    from tests.postgres import running_postgres

    figures, dagster, ticks, shapes = {}, {}, {}, {}
    with contextlib.ExitStack() as stack:
        base = args.root.resolve() if args.root else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-scale-")))
        server = args.postgres or stack.enter_context(running_postgres(kept=base / "postgres" if args.root else None))
        for count in sizes:
            root = base / str(count)
            with history(root, count, server) as made:
                figures[count] = measure(root, made, repeat)
                dagster[count] = dagster_at_scale(root, made, repeat)
                ticks[count] = sensor_tick(root, made, repeat)
                shapes[count] = made
    print("listing the evaluation results of a registry (2 in 3 manifests), median seconds:")
    print(f"{'manifests':>10} {'build index':>12} {'index':>8} {'1 changed':>10} {'files':>8} {'lineage':>8} {'trained on':>11} {'leaderboard':>12} "
          f"{'board, 1 new':>13} {'plan':>6} {'podium':>7} {'gc plan':>8} {'index MB':>9}  ratio files / index")
    for count, f in figures.items():
        print(f"{count:>10,} {f['build']:>12.3f} {f['index']:>8.3f} {f['changed']:>10.3f} {f['files']:>8.3f} {f['lineage']:>8.3f} {f['trained_on']:>11.3f} "
              f"{f['leaderboard']:>12.3f} {f['board_changed']:>13.3f} {f['plan']:>6.3f} {f['podium']:>7.3f} {f['gc']:>8.3f} {f['index_mb']:>9.1f}  {f['files'] / f['index']:.1f}x")
    print(f"over its Dagster instance (PostgreSQL) of N checkpoints x {BENCHMARK_PARTITIONS} benchmarks, median seconds: `factory evals "
          "backfill`'s planning, the UI's asset pages (their GraphQL over HTTP; first since the webserver started, then again) and "
          "the page of a backfill's run:")
    print(f"{'':>12} {'':>22} {'stored, in chunks':>18} {'without a result':>17}")
    print(f"{'checkpoints':>12} {'stored, per partition':>22} {'first':>8} {'kept':>8} {'first':>8} {'kept':>8} {'ratio':>6} "
          f"{'evaluations page':>17} {'checkpoints page':>17} {'run page':>9}")
    for count, f in dagster.items():
        pages = (f"{f['evaluations_first']:>8.3f} {f['evaluations']:>8.3f} {f['checkpoints_first']:>8.3f} {f['checkpoints']:>8.3f} {f['run']:>9.3f}"
                 if "run" in f else f"{'-':>8} {'-':>8} {'-':>8} {'-':>8} {'-':>9}")
        print(f"{shapes[count]['checkpoints']:>12,} {f['before']:>22.3f} {f['stored_first']:>8.3f} {f['stored']:>8.3f} {f['due_first']:>8.3f} {f['due']:>8.3f} "
              f"{f['before'] / f['stored_first']:>5.1f}x {pages}")
    for count, seconds in ticks.items():
        print(f"sensor tick at a commit changing 1 of {shapes[count]['files']:,} experiment files ({count:,} manifests): {seconds:.3f} s")
    if len(sizes) > 1:
        small, large = figures[sizes[0]], figures[sizes[-1]]
        print(f"ratio {sizes[-1]:,} / {sizes[0]:,} manifests: lineage {large['lineage'] / small['lineage']:.2f}x, "
              f"models trained on the data {large['trained_on'] / small['trained_on']:.1f}x (they are {sizes[-1] // sizes[0]}x as many), "
              f"leaderboard {large['leaderboard'] / small['leaderboard']:.1f}x (after a new result "
              f"{large['board_changed'] / small['board_changed']:.1f}x), plan {large['plan'] / small['plan']:.2f}x, "
              f"podium {large['podium'] / small['podium']:.2f}x, gc plan {large['gc'] / small['gc']:.1f}x, "
              f"listing from the index {large['index'] / small['index']:.1f}x, from the files {large['files'] / small['files']:.1f}x")
        few, many = dagster[sizes[0]], dagster[sizes[-1]]
        pages = ", ".join(f"{name} page {many[name] / few[name]:.2f}x" for name in ("evaluations", "checkpoints", "run") if name in few and name in many)
        print(f"ratio {sizes[-1]:,} / {sizes[0]:,} manifests ({shapes[sizes[-1]]['checkpoints']:,} / {shapes[sizes[0]]['checkpoints']:,} checkpoints, "
              f"{shapes[sizes[-1]]['files']:,} / {shapes[sizes[0]]['files']:,} files): backfill planning {many['stored_first'] / few['stored_first']:.1f}x "
              f"(without a result: {many['due_first'] / few['due_first']:.1f}x, kept {many['due'] / few['due']:.1f}x), "
              f"sensor tick {ticks[sizes[-1]] / ticks[sizes[0]]:.2f}x" + (f", {pages}" if pages else ""))


if __name__ == "__main__":
    main()
