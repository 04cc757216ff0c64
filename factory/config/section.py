"""The base of every config section."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, SerializationInfo, SerializerFunctionWrapHandler, model_serializer

UNKNOWN_KEY = "unknown_key"
"""The error type of a key a section refuses with its own list of the allowed ones (a section whose keys depend on a
value, as a source's on its kind): reported with that message as it is."""


class Section(BaseModel):
    """Base of every config section: frozen, strict about unknown keys, finite numbers only (`.inf` and `.nan` are refused).

    A field's docstring (the string under it) is its description on the reference page, which reads it from the source
    (factory/config/reference.py). Pydantic's `use_attribute_docstrings` would read it when each class is built, from
    every process that imports the schema: on Python 3.11 it walks the stack and calls `inspect.getmodule` per frame,
    1.35 s of the 2.4 s that importing the stages took, in every stage, command and Dagster process."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class GrownSection(Section):
    """A section with fields added after recipes were written: each of `UNSET_LEFT_OUT` is left out of the dump (and so of
    every fingerprint and config hash) while it is unset (None or empty), and each of `DEFAULT_LEFT_OUT` while it holds its
    default, so recipes without it keep their fingerprints."""

    UNSET_LEFT_OUT: ClassVar[tuple[str, ...]] = ()
    DEFAULT_LEFT_OUT: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _unset_left_out(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        return self._dumped(handler(self), info)

    def _dumped(self, data: dict[str, Any], info: SerializationInfo) -> dict[str, Any]:
        """The section's dump, given its fields' (`data`): the unset and default fields named above left out."""
        for name in self.UNSET_LEFT_OUT:
            if getattr(self, name) in (None, ()):
                data.pop(type(self).model_fields[name].alias or name, None)  # dumped by its alias (`from`) when it has one
                data.pop(name, None)
        for name in self.DEFAULT_LEFT_OUT:
            if getattr(self, name) == type(self).model_fields[name].default:
                data.pop(name, None)
        return data
