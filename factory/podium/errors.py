"""Podium's errors: each message says what to change."""

from __future__ import annotations

from factory.errors import FactoryError


class PodiumError(FactoryError):
    """Something a Podium user asked for cannot be shown; the message says what to change."""


class NotFound(PodiumError):
    """A namespace, table, snapshot, row or checkpoint that is not there."""


class Busy(PodiumError):
    """Every SQL worker is taken; the request may be sent again in a moment."""
