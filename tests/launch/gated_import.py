"""Imported by a warm-interpreter test: its import lasts until the file $WARM_GATE exists, so the server is still importing
when a launch arrives."""

import os
import time
from pathlib import Path

while not Path(os.environ["WARM_GATE"]).exists():
    time.sleep(0.02)
