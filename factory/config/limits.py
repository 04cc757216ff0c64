"""Upper bounds of config values: generous, but finite, so a value that passes `factory check` cannot overflow a stage later."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

MAX_BYTES = 1 << 40
MAX_STEPS = 1_000_000_000
MAX_BATCH = 1 << 20
MAX_COUNT = 1_000_000_000
MAX_RANKS = 100_000
Beta = Annotated[float, Field(ge=0, lt=1)]
