"""One of several processes racing on one store (tests/storage/test_races.py).

`racer.py MODE URI NAME COUNT GO`: opens the store, says it is ready (touches GO.NAME), waits for the file GO, then
races: `create` makes keys race/0..COUNT-1 only if absent, holding NAME-i, and reads back what each holds; `increment`
adds one to the number in `counter` COUNT times by read and replace-if-match. Prints what it saw as JSON.
"""

import json
import sys
import time
from pathlib import Path

from factory.storage import open_store

WAIT_S = 60


def main() -> None:
    mode, uri, name, count, go = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), Path(sys.argv[5])
    store = open_store(uri)
    Path(f"{go}.{name}").touch()
    deadline = time.monotonic() + WAIT_S
    while not go.exists():
        if time.monotonic() > deadline:
            sys.exit(f"{go} did not appear within {WAIT_S} s")
        time.sleep(0.001)
    if mode == "create":
        seen = []
        for i in range(count):
            won = store.create(f"race/{i}", f"{name}-{i}".encode()) is not None
            seen.append({"won": won, "holds": store.get(f"race/{i}", limit=100).data.decode()})
        print(json.dumps(seen))
    else:
        lost = 0
        for _ in range(count):
            while True:
                blob = store.get("counter", limit=100)
                if store.replace("counter", str(int(blob.data) + 1).encode(), blob.etag) is not None:
                    break
                lost += 1
        print(json.dumps({"lost": lost}))


if __name__ == "__main__":
    main()
