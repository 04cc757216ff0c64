"""Canonical hashing: config hashes, stage fingerprints and the code identity of a run."""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

import factory

CODE_SUFFIXES = (".py",)


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the same value always gives the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256_of(value: Any) -> str:
    """Hex sha256 of the canonical JSON of `value`."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def code_identity(image: str) -> str:
    """The image digest when pinned; for `local`, a hash of the `factory` source tree."""
    if image != "local":
        return image
    return "local:" + source_tree_hash(Path(factory.__file__).parent)


@cache
def source_tree_hash(root: Path) -> str:
    """Hash of every source file's relative path and bytes under `root`."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]
