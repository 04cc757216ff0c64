"""Imported by a warm-interpreter test after `tests.launch.gated_import`: its import lasts until the file $WARM_GATE_LATER
exists."""

import os
import time
from pathlib import Path

while not Path(os.environ["WARM_GATE_LATER"]).exists():
    time.sleep(0.02)
