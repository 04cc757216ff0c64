"""Sandbox cost: what the mount namespace adds to one execution, side by side with the older path, in one run.

Each execution is a fresh, confined interpreter (limits, own user as root, audit hook); the older path adds
network and IPC namespaces (`unshare`), the namespace path a bubblewrap mount, pid, network and IPC namespace
with private tmpfs. The programs are the size of a code-execution task: a function and a call. `--smoke`: a few
programs, to check the bench runs.
"""

import argparse
import time

from factory.post.sandbox import Limits, Sandbox

PROGRAMS = 100
SMOKE_PROGRAMS = 4
SOURCE = "def f(xs):\n    total = 0\n    for x in xs:\n        total += x * {k}\n    return total\nprint(repr(f(list(range({k})))))"


def seconds_per_execution(sandbox: Sandbox, programs: int) -> float:
    sources = [SOURCE.format(k=k) for k in range(programs)]
    started = time.perf_counter()
    outcomes = sandbox.run_many(sources)
    seconds = time.perf_counter() - started
    assert all(o.status == "ok" for o in outcomes), [o for o in outcomes if o.status != "ok"][:1]
    return seconds / programs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_PROGRAMS} programs: checks the bench runs")
    programs = SMOKE_PROGRAMS if parser.parse_args().smoke else PROGRAMS
    old, new = Sandbox(Limits(), workers=1, mount_namespace=False), Sandbox(Limits(), workers=1)
    print(f"older path: {old.isolation}\nnamespace path: {new.isolation}")
    seconds_per_execution(new, programs)  # warm the page cache for both
    before, after = seconds_per_execution(old, programs), seconds_per_execution(new, programs)
    print(f"one worker, ms per execution: older path {before * 1000:.1f}, namespace path {after * 1000:.1f}, "
          f"ratio {after / before:.2f}x")
    two = seconds_per_execution(Sandbox(Limits(), workers=2), programs)
    print(f"namespace path, 2 workers: {1 / two:.0f} executions/s")


if __name__ == "__main__":
    main()
