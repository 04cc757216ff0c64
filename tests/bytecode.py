"""Byte-compiles what the suite's processes import, before they start (`make test`, after each install): three workers,
and the warm interpreters, Dagster's servers, stages and ranks they start, many at once, would otherwise each compile the
same modules where no bytecode is cached yet.

Python writes a module's bytecode as it imports it, so importing is compiling, and only what is imported: the modules of
every stage kind a warm interpreter may fork (`every_warm_module`), of Dagster's processes and the `factory` command, and
of the servers and libraries the tests start or load, in a process per group, side by side. Compiling the whole
virtualenv instead (`compileall`) took twice the CPU for 26,600 files, of which the suite imports about 7,500.

A module that does not import here is named on stderr and left to the suite, where the test that needs it says why.
"""

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GROUPS: dict[str, tuple[str, ...]] = {
    "stages": ("factory.runtime.ranks", "torch.distributed.run", "torch.distributed.fsdp", "torch.distributed.checkpoint"),
    "control": ("assets.definitions", "assets.run", "assets.forkserver", "factory.__main__", "factory.cli", "dagster._daemon.cli",
                "dagster._grpc.server", "dagster_webserver.cli", "dagster_postgres"),
    "services": ("tests.s3server", "moto.server", "factory.podium.app", "ray", "ray.data", "mlflow", "transformers",
                 "transformers.models.llama", "matplotlib.pyplot", "hypothesis", "playwright.sync_api"),
}
"""What each process imports; the stages' group adds every warm module of every registered stage kind."""


def group_modules(name: str) -> tuple[str, ...]:
    if name != "stages":
        return GROUPS[name]
    from factory.runtime import every_warm_module

    return (*every_warm_module(), *GROUPS[name])


def import_group(name: str) -> int:
    """Import one group's modules in this process; each one that fails, named on stderr. How many imported."""
    imported = 0
    for module in group_modules(name):
        try:
            importlib.import_module(module)
            imported += 1
        except Exception as e:  # noqa: BLE001 - any failure is the suite's to report, in the test that needs the module
            print(f"bytecode: {module} did not import ({type(e).__name__}: {e}); the suite compiles what it needs as it goes", file=sys.stderr)
    return imported


def main() -> None:
    if len(sys.argv) == 2:
        import_group(sys.argv[1])
        from factory.launch.ending import exit_now

        exit_now(0)  # the bytecode is written: no second of unloading torch, Ray, Daft module by module
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    processes = [subprocess.Popen([sys.executable, "-m", "tests.bytecode", name], cwd=REPO, env=env, stdout=subprocess.DEVNULL) for name in GROUPS]
    for name, process in zip(GROUPS, processes, strict=True):
        if process.wait() != 0:  # killed, or it could not start: its modules are left to the suite
            print(f"bytecode: the {name} group's process ended with code {process.returncode}", file=sys.stderr)
    print(f"byte-compiled what the suite imports in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
