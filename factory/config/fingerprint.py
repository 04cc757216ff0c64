"""Canonical hashing: config hashes, stage fingerprints and the code identity of a run."""

from __future__ import annotations

import hashlib
import json
import sys
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


def plugin_code(declared: Any) -> str:
    """The code identity of what a plugin declares (a benchmark's function, say): a hash of the sources of the top-level
    package (or lone module) that defines it, so an edit of the plugin makes what it computed stale without a version bump.
    "" for the factory's own code, which `code_identity` covers already."""
    module = sys.modules.get(getattr(declared, "__module__", "") or "")
    if module is None or module.__name__.partition(".")[0] == factory.__name__:
        return ""
    top = sys.modules.get(module.__name__.partition(".")[0], module)
    origin = getattr(top, "__file__", None)
    if origin is None:  # a namespace package or a module made in memory: nothing on disk to hash
        return ""
    path = Path(origin)
    if path.name == "__init__.py":
        return "plugin:" + source_tree_hash(path.parent)
    return "plugin:" + hashlib.sha256(path.read_bytes()).hexdigest()[:16]


@cache
def source_tree_hash(root: Path) -> str:
    """Hash of every source file's relative path and bytes under `root`."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]
