"""`from:` references: the model a post-training stage starts from, when it is not this file's own.

Three forms, each resolved to one registry digest when the experiment is planned (`factory.ops.bases`):
- `experiments/base.md#model`: another experiment's exported model, the file read at the same commit as the file naming
  it (`experiments/sweep.md@<variant name>#model` for one variant of a sweep);
- `alias:production`: the model a promotion alias names now;
- `model@<sha256>`: a published model by its digest (or its first 12 or more hex digits).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from factory.registry.aliases import ALIAS
MODEL_PREFIX = "model@"
ALIAS_PREFIX = "alias:"
_DIGEST = re.compile(r"^[0-9a-f]{12,64}$")
_EXPERIMENT = re.compile(r"^(?P<path>[^#@\0]+\.md)(?:@(?P<variant>[a-z0-9][a-z0-9._=-]{0,127}))?#(?P<stage>[a-z][a-z0-9_]*)$")
FORMS = "`experiments/<file>.md#model` (`<file>.md@<variant>#model` for a sweep), `alias:<name>` or `model@<sha256>`"

BaseRef = Annotated[str | None, Field(alias="from")]
"""Where the model this stage starts from comes from, instead of this file's own training: """ + FORMS


@dataclass(frozen=True, kw_only=True, slots=True)
class ParsedRef:
    """A `from:` reference, taken apart."""

    form: Literal["experiment", "alias", "digest"]
    text: str
    """As the file wrote it."""
    path: str = ""
    """experiment: the file, as written (relative to the naming file's directory, or to its repository)."""
    variant: str | None = None
    """experiment: the sweep variant, by name."""
    stage: str = ""
    """experiment: the stage whose output it names (the exported model)."""
    name: str = ""
    """alias: the alias's name."""
    digest: str = ""
    """digest: the digest (or its prefix)."""


def parse_base_ref(text: str) -> ParsedRef:
    """`text` taken apart; ValueError naming the three forms when it is none of them."""
    if text.startswith(ALIAS_PREFIX):
        name = text.removeprefix(ALIAS_PREFIX)
        if not ALIAS.match(name):
            raise ValueError(f"{name!r} is not an alias name: lower-case letters, digits, '_' and '-' (e.g. alias:production)")
        return ParsedRef(form="alias", text=text, name=name)
    if text.startswith(MODEL_PREFIX):
        digest = text.removeprefix(MODEL_PREFIX)
        if not _DIGEST.match(digest):
            raise ValueError(f"{digest!r} is not a model digest: its sha256, or at least its first 12 hex digits")
        return ParsedRef(form="digest", text=text, digest=digest)
    if match := _EXPERIMENT.match(text):
        return ParsedRef(form="experiment", text=text, path=match["path"], variant=match["variant"], stage=match["stage"])
    raise ValueError(f"expected {FORMS}, found {text!r}")


def base_ref(value: str | None) -> str | None:
    """A field validator: `value` when it parses as a `from:` reference."""
    if value is not None:
        parse_base_ref(value)
    return value
