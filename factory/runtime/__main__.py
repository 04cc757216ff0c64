"""`python -m factory.runtime <request.json>`: run one stage, publish its artifact, report it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from factory.config.kinds import registered_kinds
from factory.config.stages import StageSpec
from factory.devices import device_for
from factory.errors import FactoryError
from factory.launch.local import SCRATCH_ENV
from factory.podium.links import table_links
from factory.registry.files import DIGEST
from factory.registry.lease import abandoned
from factory.registry import open_registry
from factory.runtime import runner
from factory.runtime.context import WARNINGS, StageContext
from factory.runtime.exits import interrupted, say_error, stop_on_signals
from factory.launch.ending import exit_now
from factory.runtime.report import Reporter, open_reporter
from factory.runtime.request import StageRequest
from factory.train.distributed import World, broadcast, join, leave, world_from_env

USAGE = "usage: python -m factory.runtime <request.json>"
ARTIFACT_PATH = re.compile(r"objects/([0-9a-f]{64})/")
"""A published artifact's file, named by path (in the registry, or in the local copies of an object store's) or by its
place in the store (`s3://…/objects/<digest>/…`)."""
with contextlib.suppress(FactoryError):  # a plugin that cannot be loaded: `main` says so, as the stage's error
    registered_kinds()  # read as this module is imported: a warm interpreter holds them for every stage it forks


def run(request: StageRequest) -> None:
    """Run the stage unless its artifact is already published; report the artifact either way.

    Under torchrun every rank runs this: rank 0 holds the lease, decides whether the stage must
    run and tells the others; only rank 0 publishes and reports.
    """
    world = world_from_env(gpus=request.gpus)
    join(world, request.placement.get("backend"))
    try:
        with open_reporter(request.spec.kind) as reporter:
            if world.is_main:
                if request.gpus:  # asked for GPUs: said once, in the stage's log, when the machine has none
                    device_for(request.gpus, world.local_rank, reporter.log)
                _run_main(request, reporter, world)
            elif broadcast(world, None) == "miss":
                with tempfile.TemporaryDirectory(prefix="rank-", dir=stage_scratch()) as scratch:
                    registry = open_registry(request.registry, patient=True)
                    runner(request.spec.kind)(StageContext(request=request, registry=registry, out=Path(scratch), reporter=reporter))
    finally:
        leave(world)


def stage_scratch() -> str | None:
    """The directory the launcher removes when the stage ends (`SCRATCH_ENV`), where a rank keeps its own temporary files;
    None (the system's temporary directory) where no launcher named one, or it has gone."""
    scratch = os.environ.get(SCRATCH_ENV)
    return scratch if scratch and os.path.isdir(scratch) else None


def _run_main(request: StageRequest, reporter: Reporter, world: World) -> None:
    spec = request.spec
    registry = open_registry(request.registry, patient=True)
    with registry.lease(
        spec.fingerprint,
        owner=f"{spec.kind} for {request.provenance.experiment} (pid {os.getpid()} on {socket.gethostname()})",
        on_wait=lambda holder: reporter.log.info("awaiting cache: %s is computing this stage", holder.owner),
        on_takeover=lambda holder: reporter.log.info("taking over the lease of %s (%s)", holder.owner, abandoned(holder) or "released"),
        needs=reads(spec),
    ):
        manifest = registry.lookup(spec.fingerprint)
        cache = "hit" if manifest else "miss"
        broadcast(world, cache)
        if manifest is None:
            with registry.staging() as out:
                compute = runner(spec.kind)  # its imports are the process's start-up, not the stage's work
                wall, cpu = time.perf_counter(), time.process_time()
                summary = compute(StageContext(request=request, registry=registry, out=out, reporter=reporter))
                # What computing it cost (this process; under torchrun, rank 0's share): shown in run reports.
                summary = {**summary, "wall_seconds": round(time.perf_counter() - wall, 2), "cpu_seconds": round(time.process_time() - cpu, 2)}
                manifest = registry.publish(
                    out,
                    kind=spec.kind,
                    fingerprint=spec.fingerprint,
                    config=spec.config,
                    inputs=spec.upstream,
                    code=spec.code,
                    provenance=request.provenance,
                    summary=summary,
                )
            registry.drop_work(spec.fingerprint)
            reporter.log.info("published %s artifact %s", spec.kind, manifest.digest[:12])
        if warnings := manifest.summary.get(WARNINGS):
            reporter.log.warning("%s: %s", spec.kind, warnings)
        artifact = {"raw_value": registry.where(manifest.digest), "type": "path"}
        links = {name: {"raw_value": url, "type": "url"} for name, url in table_links(manifest.summary).items()}
        reporter.materialized({**as_metadata(manifest.metadata()), "cache": cache, "artifact": artifact, **links}, manifest.digest)


def reads(spec: StageSpec) -> list[str]:
    """The digests of the artifacts a stage reads while it computes, which its lease lists (`factory registry gc` keeps them):
    its inputs, and the published artifacts its config names by path (an evaluation batch's checkpoints)."""
    named = ARTIFACT_PATH.findall(json.dumps(spec.config))
    return sorted(digest for digest in {*spec.upstream.values(), *named} if DIGEST.match(digest))


def as_metadata(values: dict[str, Any]) -> dict[str, Any]:
    """A manifest's key/values as Pipes metadata: a mapping or a list (a kind's summary may hold one) as JSON."""
    return {key: {"raw_value": value, "type": "json"} if isinstance(value, (dict, list, tuple)) else value for key, value in values.items()}


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit 0 on success, 1 when the stage fails, 2 on bad input."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    stop_on_signals()
    try:
        request = StageRequest.read(Path(args[0]))
        if request.spec.kind not in (known := [kind.name for kind in registered_kinds()]):
            say_error(f"unknown stage kind {request.spec.kind!r}; known: {', '.join(known)}")
            return 2
        run(request)
    except FactoryError as e:
        say_error(str(e))
        return e.exit_code
    except (KeyboardInterrupt, Exception) as e:
        if interrupted(e):  # Ctrl-C or SIGTERM, however the code it landed in passed it on
            say_error("interrupted before it finished; its artifact was not published")
            return 1
        if not isinstance(e, OSError):
            raise
        from factory.storage.s3_retry import warehouse_outage  # pyarrow is loaded already when this is what failed

        if (outage := warehouse_outage(e)) is None:
            raise
        say_error(str(outage))
        return outage.exit_code
    return 0


if __name__ == "__main__":
    exit_now(main())
