"""Promotion: an alias (`production`) names a model, with every promotion and demotion kept.

The history of an alias is append-only (`history/promotions/<alias>` in the registry): a
promotion records the model, who asked, why, and what allowed it; a demotion records that the
alias goes back to the model it named before. Nothing is overwritten, so a rollback is a new
record and the record of what was in production when stays. A model may be promoted when a
reproduction of it matched, or when its experiment file says why it is not deterministic
(`nondeterministic: <reason>`); the Dagster layer adds its own condition, the blocking asset checks.
"""

from __future__ import annotations

import datetime
import getpass
from pathlib import Path

from factory.config import load_file
from factory.config.kinds import model_kind
from factory.config.stages import config_hash
from factory.errors import ConfigError
from factory.preflight import experiment_files
from factory.registry import aliases
from factory.registry.aliases import Standing
from factory.registry.seam import Records, Registry
from factory.registry.store import Manifest
from factory.ops.reproduce import reproductions


def history(registry: Registry, alias: str) -> Records:
    """The append-only history of an alias."""
    return aliases.history(registry, alias)


def standing(registry: Registry, alias: str) -> Standing:
    """The model an alias names after its whole history (promotions push, demotions pop)."""
    return aliases.standing(registry, alias)


def grounds(registry: Registry, model: Manifest, experiments: Path) -> tuple[str | None, list[str]]:
    """Why the model may be promoted (a matched reproduction, or the file's stated nondeterminism); else the problems."""
    tried = reproductions(registry, model.digest)
    if tried and tried[-1]["matched"]:
        return f"reproduction {tried[-1]['seq']} matched ({tried[-1]['created']})", []
    problems = []
    if tried:
        first = next((s for s in tried[-1]["stages"] if not s["matched"]), None)
        problems.append(f"the last reproduction did not match: {first['kind']}: {first['reason']}" if first else
                        "the last reproduction did not run every stage")
    else:
        problems.append(f"the model was never reproduced: run `factory reproduce {model.digest[:12]}` first")
    reason = _stated_nondeterminism(model, experiments)
    if reason:
        return f"the experiment says it is not deterministic: {reason}", []
    return None, problems


def _stated_nondeterminism(model: Manifest, experiments: Path) -> str | None:
    """The `nondeterministic` reason of the experiment file that made the model (its recipe hash must match)."""
    for path in experiment_files([experiments]) if experiments.exists() else []:
        try:
            variants = load_file(path)
        except ConfigError:
            continue
        for experiment in variants:
            if experiment.name == model.experiment and config_hash(experiment) == model.config_hash and experiment.nondeterministic:
                return experiment.nondeterministic
    return None


def promote(registry: Registry, model: Manifest, alias: str, reason: str, allowed_by: str, checks: str) -> int:
    """Record a promotion; its number in the alias's history."""
    if model.kind != model_kind().name:
        raise ConfigError(f"{model.digest[:12]} is a {model.kind} artifact; only models are promoted")
    return history(registry, alias).append({
        "action": "promote", "model": model.digest, "experiment": model.experiment, "git_commit": model.git_commit,
        "reason": reason, "allowed_by": allowed_by, "checks": checks, "by": _who(), "at": _now(),
    })


def demote(registry: Registry, alias: str, reason: str) -> tuple[int, str | None]:
    """Record that the alias goes back to the model it named before; the record's number and that model."""
    current = standing(registry, alias)
    if current.model is None:
        raise ConfigError(f"{alias} names no model; there is nothing to demote")
    seq = history(registry, alias).append({"action": "demote", "model": current.model, "reason": reason, "by": _who(), "at": _now()})
    return seq, standing(registry, alias).model


def _who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
