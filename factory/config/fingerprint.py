"""Canonical hashing: config hashes, stage fingerprints and the code identity of a run."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable, Mapping
from functools import cache
from importlib.metadata import packages_distributions
from json.encoder import encode_basestring
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


def canonical_parts(value: Mapping[str, Any]) -> dict[str, str]:
    """The canonical JSON of each entry of a mapping with text keys, as `canonical_json` writes it inside the mapping: for
    entries shared by many fingerprints, to serialize once (`sha256_of_parts`)."""
    return {key: _part(item) for key, item in value.items()}


def sha256_of_parts(parts: Mapping[str, str]) -> str:
    """`sha256_of` the mapping whose entries' canonical JSON `parts` holds (`canonical_parts`), the same digest: a
    backfill's planning hashes 10,000 evaluations that share one training's model settings, serialized once."""
    text = "{" + ",".join(f"{encode_basestring(key)}:{parts[key]}" for key in sorted(parts)) + "}"
    return hashlib.sha256(text.encode()).hexdigest()


def _part(value: Any) -> str:
    """`canonical_json(value)`; a text or an integer without the encoder's set-up (most of the time it takes for one)."""
    if type(value) is str:
        return encode_basestring(value)
    if type(value) is int:
        return int.__repr__(value)
    return canonical_json(value)


def code_identity(image: str) -> str:
    """The image digest when pinned; for `local`, a hash of the `factory` source tree."""
    if image != "local":
        return image
    return "local:" + source_tree_hash(Path(factory.__file__).parent)


def plugin_code(declared: Any) -> str:
    """The code identity of what a plugin declares (a benchmark's function, say): a hash of the sources of the top-level
    package (or lone module) that defines it, so an edit of the plugin makes what it computed stale without a version bump.
    "" for the factory's own code, which `code_identity` covers already."""
    found = module_code(_module_of(declared))
    return f"plugin:{found[1]}" if found else ""


def plugins_code(declared: Iterable[Any]) -> dict[str, str]:
    """{distribution: hash of its code} of the plugin packages that define `declared` (functions, classes, or
    `module:function` names); the factory's own code is left out (`code_identity` covers it)."""
    found = sorted({hit for hit in (module_code(_module_of(item)) for item in declared if item is not None) if hit is not None})
    codes: dict[str, str] = {}
    for distribution, digest in found:  # one distribution's several top-level modules: one hash of them all
        codes[distribution] = hashlib.sha256(f"{codes[distribution]}{digest}".encode()).hexdigest()[:16] if distribution in codes else digest
    return codes


def with_plugins(code: str, plugins: Mapping[str, str]) -> str:
    """A stage's code identity: the factory's, then each plugin package it runs as `distribution:hash`, space-separated."""
    return " ".join([code, *(f"{name}:{digest}" for name, digest in sorted(plugins.items()))])


def code_parts(code: str) -> dict[str, str]:
    """A code identity taken apart: {"factory": its own, distribution: hash, ...} (`with_plugins`' inverse)."""
    own, *plugins = code.split(" ")
    return {"factory": own, **dict(part.rpartition(":")[::2] for part in plugins)}


def module_code(module_name: str) -> tuple[str, str] | None:
    """(distribution, hash) of the top-level package (or lone module) `module_name` belongs to; None for the factory's own
    code, a module not imported, or one with nothing on disk to hash (a namespace package, a module made in memory)."""
    top_name = module_name.partition(".")[0]
    if not top_name or top_name == factory.__name__:
        return None
    top = sys.modules.get(top_name) or sys.modules.get(module_name)
    origin = getattr(top, "__file__", None)
    if origin is None:
        return None
    path = Path(origin)
    digest = source_tree_hash(path.parent) if path.name == "__init__.py" else hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return _distribution(top_name), digest


def _module_of(declared: Any) -> str:
    if isinstance(declared, str):
        return declared.partition(":")[0]
    return getattr(declared, "__module__", "") or ""


@cache
def _distributions() -> Mapping[str, list[str]]:
    return packages_distributions()


def _distribution(top_module: str) -> str:
    """The installed distribution that provides `top_module` (the module's own name when none does)."""
    return next(iter(_distributions().get(top_module, [])), top_module)


@cache
def source_tree_hash(root: Path) -> str:
    """Hash of every source file's relative path and bytes under `root`."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]
