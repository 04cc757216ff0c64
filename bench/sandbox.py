"""Sandbox throughput: small programs executed per second on this machine, one worker vs. two (the machine's cores).

Each execution is a fresh, confined interpreter (limits, own user and network namespace as root,
audit hook); the programs are the size of a code-execution task: a function and a call.
"""

import time

from factory.post.sandbox import Limits, Sandbox

PROGRAMS = 200
SOURCE = "def f(xs):\n    total = 0\n    for x in xs:\n        total += x * {k}\n    return total\nprint(repr(f(list(range({k})))))"


def rate(workers: int) -> float:
    sandbox = Sandbox(Limits(), workers=workers)
    sources = [SOURCE.format(k=k) for k in range(PROGRAMS)]
    started = time.perf_counter()
    outcomes = sandbox.run_many(sources)
    seconds = time.perf_counter() - started
    assert all(o.status == "ok" for o in outcomes), [o for o in outcomes if o.status != "ok"][:1]
    return PROGRAMS / seconds


def main() -> None:
    one, two = rate(1), rate(2)
    print(f"sandboxed executions per second: 1 worker {one:.0f}/s, 2 workers {two:.0f}/s")
    print(f"ratio 2 workers / 1 worker: {two / one:.2f}x")


if __name__ == "__main__":
    main()
