"""A rank for tests/launch/test_ranks.py: `python -m tests.launch.rank_probe OUT MODE` writes what it sees to
OUT/rank-N.json, then per MODE: `ok` ends, `fail` ends rank 1 with exit code 3, `kill` has rank 1 SIGKILL itself, `wait`
sleeps until stopped, noting a SIGTERM in OUT/stopped-N."""

import sys

PRELOADED = "torch" in sys.modules  # before this module imports it: what the process it started as had imported

import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

if __name__ == "__main__":
    out, mode = Path(sys.argv[1]), sys.argv[2]
    rank = int(os.environ["RANK"])
    seen = {"rank": rank, "world": int(os.environ["WORLD_SIZE"]), "local_rank": int(os.environ["LOCAL_RANK"]), "name": __name__,
            "argv": sys.argv[1:], "threads": torch.get_num_threads(), "preloaded": PRELOADED, "pid": os.getpid(),
            "random": random.random()}
    (out / f"rank-{rank}.json").write_text(json.dumps(seen))
    print(f"rank {rank} says hello", file=sys.stderr, flush=True)
    if mode == "fail" and rank == 1:
        sys.exit(3)
    if mode == "kill" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "wait":  # a SIGTERM is a stop asked for: said in a file, then the exit a stage makes of it
        signal.signal(signal.SIGTERM, lambda *_: ((out / f"stopped-{rank}").write_text("SIGTERM"), sys.exit(143)))
        time.sleep(300)
