"""Split an experiment into stages; each stage's fingerprint is derived from what changes its bytes."""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from factory.config.fingerprint import code_identity, sha256_of
from factory.config.schema import Experiment
from factory.errors import ConfigError

# Each stage and the stages whose artifacts it reads, in the order they run.
UPSTREAM: dict[str, tuple[str, ...]] = {
    "corpus": (),
    "tokenizer": ("corpus",),
    "checkpoints": ("corpus", "tokenizer"),
    "model": ("checkpoints", "tokenizer"),
    "evaluation": ("model", "corpus"),
}
STAGES = tuple(UPSTREAM)
# Identity and prose, not recipe: two files with the same recipe have the same config hash.
NOT_RECIPE = {"name", "description", "source", "variant"}


@dataclass(frozen=True, kw_only=True, slots=True)
class StageSpec:
    """What one stage computes: kind + its own config + upstream digests + code identity."""

    kind: str
    config: Mapping[str, Any]
    upstream: Mapping[str, str]
    code: str
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        identity = {"kind": self.kind, "config": self.config, "upstream": self.upstream, "code": self.code}
        object.__setattr__(self, "fingerprint", sha256_of(identity))

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form, as written for the stage process."""
        return {"kind": self.kind, "config": dict(self.config), "upstream": dict(self.upstream), "code": self.code}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StageSpec:
        """Inverse of `to_json`."""
        return cls(kind=data["kind"], config=data["config"], upstream=data["upstream"], code=data["code"])


def stage_config(experiment: Experiment, kind: str) -> dict[str, Any]:
    """The part of the experiment that changes this stage's output (placement excluded)."""
    dump = experiment.model_dump(mode="json")
    seed = experiment.seed
    match kind:
        case "corpus":
            # The standard library differs between interpreters, so the version is part of the data.
            return {"data": dump["data"], "python": platform.python_version()}
        case "tokenizer":
            return {"tokenizer": dump["tokenizer"], "seed": seed}
        case "checkpoints":
            return {"model": dump["model"], "pretrain": dump["pretrain"], "seed": seed}
        case "model":
            return {}
        case "evaluation":
            return {"eval": dump["eval"], "model": dump["model"], "seed": seed}
    raise ConfigError(f"unknown stage {kind!r}; stages are: {', '.join(STAGES)}")


def plan_stage(experiment: Experiment, kind: str, upstream: Mapping[str, str]) -> StageSpec:
    """Build the spec of one stage from the experiment and its upstream artifact digests."""
    if kind in STAGES and kind not in experiment.stages():
        raise ConfigError(f"{experiment.name} has no {kind} stage: its file has no section for it")
    missing = [name for name in UPSTREAM.get(kind, ()) if name not in upstream]
    if missing:
        raise ConfigError(f"stage {kind!r} needs the digests of {', '.join(missing)} before it can be planned")
    return StageSpec(
        kind=kind,
        config=stage_config(experiment, kind),
        upstream={name: upstream[name] for name in UPSTREAM[kind]},
        code=code_identity(experiment.image),
    )


def config_hash(experiment: Experiment) -> str:
    """Hash of the recipe: every section, placement included; the name and the prose are not."""
    return sha256_of(experiment.model_dump(mode="json", exclude=NOT_RECIPE))[:16]
