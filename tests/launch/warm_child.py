"""Run by the warm-launcher tests as `python -m tests.launch.warm_child OUT [SECONDS]`: records what the process sees."""

import json
import os
import sys
import tempfile
import time

if __name__ == "__main__":
    seen = {"pid": os.getpid(), "parent": os.getppid(), "argv": sys.argv[1:], "cwd": os.getcwd(), "marker": os.environ.get("WARM_MARKER"),
            "preloaded": "email.mime.text" in sys.modules, "name": __name__, "modules": sorted(sys.modules),
            "current_test": os.environ.get("PYTEST_CURRENT_TEST"), "tempdir": tempfile.gettempdir()}
    with open(sys.argv[1], "w") as out:
        json.dump(seen, out)
    print("said on stdout")
    print("said on stderr", file=sys.stderr)
    if len(sys.argv) > 2:
        time.sleep(float(sys.argv[2]))
    if os.environ.get("WARM_ENDING") == "exit_now":  # as a stage process ends
        from factory.launch.ending import exit_now

        exit_now(int(os.environ.get("WARM_EXIT", "0")))
    sys.exit(int(os.environ.get("WARM_EXIT", "0")))
