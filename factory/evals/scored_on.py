"""What data a score was measured on, and which scores compare.

Every evaluation result records the identity of the data it read (`data` in its summary):

- `blend:<blend digest>+<reading>`: the experiment's own held-out split, the blend's validation
  documents in the order the experiment's seed and shuffle buffer give, up to its `eval.max_bytes`
  (both digests shortened). Experiments with the same blend and the same reading read the same bytes.
- `namespace.table@tag#content-<sha>`: a pinned table version and the content read under that tag,
  so two catalogs that generated different bytes under one tag do not compare.
- anything else: fixed data the benchmark names in words ("fixed prompts").

Two scores compare when they are of the same benchmark, at the same version, on the same data. A
result from before the data was recorded reads as `unrecorded:<experiment>`: it compares with
nothing but the same experiment's results.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from factory.config.fingerprint import sha256_of

OWN_SPLIT = "blend:"
UNRECORDED = "unrecorded:"
TABLE_REF = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+@[A-Za-z0-9_.-]+")
"""`namespace.table@tag`: the `data` of a benchmark that reads a pinned table version."""


def own_split(blend_digest: str, seed: int, shuffle_buffer_docs: int | None, max_bytes: int) -> str:
    """The identity of an experiment's own held-out split as its evaluations read it."""
    reading = sha256_of({"seed": seed, "shuffle_buffer_docs": shuffle_buffer_docs, "max_bytes": max_bytes})
    return f"{OWN_SPLIT}{blend_digest[:16]}+{reading[:8]}"


def pinned(ref: str, content: str) -> str:
    """The identity of a pinned table version: its ref and the content tag (or snapshot) read under it."""
    return f"{ref}#{content}"


def table_ref(data: str) -> str | None:
    """The `namespace.table@tag` a benchmark's `data` names, or None when it names no table version."""
    return data if TABLE_REF.fullmatch(data) else None


def data_of(summary: Mapping[str, Any]) -> str:
    """The data identity of an evaluation result from its manifest summary; `unrecorded:<experiment>` for old results."""
    return summary.get("data") or f"{UNRECORDED}{summary['experiment']}"


def is_own_split(identity: str) -> bool:
    """Whether the identity is an experiment's own held-out split."""
    return identity.startswith(OWN_SPLIT)


def is_shared(identity: str) -> bool:
    """Whether the identity names data any experiment can be scored on (a pinned table version, fixed prompts)."""
    return not identity.startswith((OWN_SPLIT, UNRECORDED))


def describe(identity: str) -> str:
    """The identity in words, for notes and refusals."""
    if is_own_split(identity):
        return f"its own held-out split (blend {identity[len(OWN_SPLIT):].partition('+')[0][:8]}…)"
    if identity.startswith(UNRECORDED):
        return "unrecorded data (evaluated before results recorded their data)"
    return identity
