"""Split an experiment into stages; each stage's fingerprint is derived from what changes its bytes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from factory.config.fingerprint import code_identity, plugins_code, sha256_of, with_plugins
from factory.config.pools import TRAINING_POOL
from factory.config.architectures import architecture
from factory.config.kinds import BLEND, TOKENIZER, Placement, StageKind, computed_datasets, provider, stage_kind, stage_kinds
from factory.config.schema import Experiment
from factory.config.filter_kinds import document_filter
from factory.config.source_kinds import source_kind
from factory.errors import ConfigError

PENDING = "pending:"
"""Stands for the digest of an upstream artifact not computed yet, before its fingerprint, when a plan looks ahead."""
# Identity and prose, not recipe: two files with the same recipe have the same config hash.
NOT_RECIPE = {"name", "description", "source", "variant", "nondeterministic", "bound"}
_DERIVED = {
    "STAGES": lambda kinds: tuple(k.name for k in kinds),
    "UPSTREAM": lambda kinds: {k.name: k.reads for k in kinds},
    "TRAINING_STAGES": lambda kinds: tuple(k.name for k in kinds if k.checkpoints),
    "DATA_STAGES": lambda kinds: tuple(k.name for k in kinds if k.writes_tables),
}
"""Lists derived from the registered stage kinds (`factory.config.kinds`), read as this module's attributes when first
used (so a broken plugin is reported where a command can say so): `STAGES` (every kind, upstream first), `UPSTREAM`
(kind -> the kinds it reads), `TRAINING_STAGES` (the kinds with checkpoints) and `DATA_STAGES` (the kinds that write table
versions)."""
BASE = "base"
"""The input of the stage that starts from a model made elsewhere (`sft.from`, `rl.from`): that model's digest."""
FROM_HF = "from_hf"
"""What a training stage starts from when it starts from the Hugging Face checkpoint `model.from_hf` names: no input,
since the checkpoint is outside the registry (the digest of its files is in the stage's config)."""
HASHED_WHEN_ABSENT = ("pretrain",)
"""Sections in the config hash even when absent (recipes had them from the start); other stage sections are left out
when absent, so recipes written before a kind existed keep their hash."""


def __getattr__(name: str) -> Any:
    if name in _DERIVED:
        return _DERIVED[name](stage_kinds())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def stages_of(experiment: Experiment) -> tuple[str, ...]:
    """The stages this experiment runs, in order: a stage whose section is absent is not run."""
    return tuple(kind.name for kind in stage_kinds() if kind.runs_in(experiment))


def pool_of(kind: str) -> str | None:
    """The concurrency pool a stage kind takes a slot of (None: it runs unbounded)."""
    return TRAINING_POOL if stage_kind(kind).checkpoints else None


def placement(experiment: Experiment, kind: str) -> Placement:
    """Where a stage of `experiment` runs, as its kind's placement rule says."""
    return stage_kind(kind).placement(experiment)


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
    return stage_kind(kind).config_of(experiment)


def upstream_of(experiment: Experiment, kind: str) -> tuple[str, ...]:
    """The inputs this stage of this experiment reads: the stages it reads that the experiment runs, and, in a file that
    starts from a model made elsewhere, that model (`base`, for the stage that starts from it) and the inputs it stands
    in for (the blend and tokenizer the base model was trained with)."""
    stages = stages_of(experiment)
    inherited = inherited_inputs() if experiment.base is not None else ()
    names = tuple(name for name in stage_kind(kind).reads_of(experiment) if name in stages or name in inherited)
    return (BASE, *names) if experiment.base is not None and experiment.base[0] == stage_kind(kind).section else names


def inherited_inputs() -> tuple[str, ...]:
    """What a file that starts from a model made elsewhere reads of that model's lineage instead of making its own: the
    blend (the held-out data its evaluations read) and the tokenizer."""
    return provider(BLEND).name, provider(TOKENIZER).name


def plan_stage(experiment: Experiment, kind: str, upstream: Mapping[str, str]) -> StageSpec:
    """Build the spec of one stage from the experiment and its upstream artifact digests."""
    stage_kind(kind)  # an unknown kind says so before anything else
    if kind not in stages_of(experiment):
        raise ConfigError(f"{experiment.name} has no {kind} stage: its file has no section for it")
    needed = upstream_of(experiment, kind)
    upstream = {**experiment.bound, **upstream}
    missing = [name for name in needed if name not in upstream]
    if missing:
        bind = " (its `from` is resolved by factory.ops.bases.bind)" if experiment.base and set(missing) & {BASE, *inherited_inputs()} else ""
        raise ConfigError(f"stage {kind!r} needs the digests of {', '.join(missing)} before it can be planned{bind}")
    return StageSpec(
        kind=kind,
        config=stage_config(experiment, kind),
        upstream={name: upstream[name] for name in needed},
        code=stage_code(experiment, kind),
    )


def stage_code(experiment: Experiment, kind: str) -> str:
    """The code identity of one stage: the image when pinned (it holds the plugins); for `local`, the factory's source tree
    and, for each plugin package whose code the stage runs (its kind's, the source kinds it reads, the architecture it
    builds), that package's name and a hash of its sources: editing a plugin reruns what it computes and nothing else."""
    code = code_identity(experiment.image)
    if experiment.image != "local":
        return code
    return with_plugins(code, plugins_code(_declared_code(experiment, stage_kind(kind))))


def _declared_code(experiment: Experiment, kind: StageKind) -> list[Any]:
    """What of the plugins' declarations one stage runs."""
    declared: list[Any] = [kind.run, kind.config, kind.fingerprint]
    if kind.training is not None:
        declared += [kind.training.batches, kind.training.loss]
    if kind.reads_sources:
        declared += [source_kind(experiment.data.datasets[name].source.kind).root for name in computed_datasets(experiment)]
    if kind.runs_filters:
        declared += [document_filter(custom).keep for name in computed_datasets(experiment)
                     for custom in experiment.data.datasets[name].filters.custom]
    if kind.checkpoints or kind.exports_model:
        declared.append(architecture(experiment.model.arch).build)
    return declared


def config_hash(experiment: Experiment) -> str:
    """Hash of the recipe: every section, placement included; the name and the prose are not."""
    optional = [k.section for k in stage_kinds() if k.section and k.section not in HASHED_WHEN_ABSENT]
    absent = {name for name in (*optional, "export") if getattr(experiment, name) is None}  # recipes without them keep their hash
    return sha256_of(experiment.model_dump(mode="json", exclude=NOT_RECIPE | absent))[:16]
