"""The exceptions a user can cause. Each message says what to change.

And how a number given in the environment is read (`number_setting`): a wrong one is a ConfigError naming the variable.
"""

import math


class FactoryError(Exception):
    """Root of every error the factory raises on purpose."""

    exit_code = 1


class ConfigError(FactoryError):
    """An experiment file is malformed; the message names file:line and the field."""

    exit_code = 2


class PluginError(ConfigError):
    """A plugin (a stage kind, a model architecture) that cannot be registered; the message names the plugin and what to change."""


class ArtifactError(FactoryError):
    """An artifact is missing, incomplete or does not match its manifest."""


class StorageError(FactoryError):
    """The artifact store failed a request after its retries (unreachable, refused, timed out); the message names the
    store and the object. Opening a store that cannot work at all is a ConfigError instead."""


class LaunchError(FactoryError):
    """A stage process could not be started."""


class StageFailed(FactoryError):
    """A stage process ran and failed."""


class Interrupted(FactoryError):
    """A stage was stopped (Ctrl-C, SIGTERM) before it finished; the message says where, and what a rerun goes on from."""

    exit_code = 130  # what a shell reports for a command that SIGINT ended


def number_setting(name: str, text: str | None, *, default: float, low: float, high: float, says: str) -> float:
    """The value `text` of the environment variable `name` as a number from `low` to `high`, `default` when it is unset or
    empty; a ConfigError naming the variable and saying `says` (what to give) for anything else: words, NaN, infinities,
    a number out of range."""
    text = (text or "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):
        raise ConfigError(f"{name}={text!r}: {says}")
    return value
