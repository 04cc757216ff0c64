"""Split an experiment into stages; each stage's fingerprint is derived from what changes its bytes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from factory.config.fingerprint import code_identity, sha256_of
from factory.config.schema import Experiment
from factory.config.sources import source_files
from factory.errors import ConfigError

# Each stage and the stages whose artifacts it reads, in the order they run.
UPSTREAM: dict[str, tuple[str, ...]] = {
    "raw_datasets": (),
    "deduped_datasets": ("raw_datasets",),
    "filtered_datasets": ("deduped_datasets",),
    "blend": ("filtered_datasets",),
    "tokenizer": ("blend",),
    "pretrain": ("blend", "tokenizer"),
    # Post-training reads the model it starts from; blend and tokenizer name the held-out data its evaluations read.
    "sft": ("blend", "tokenizer", "pretrain"),
    "rl": ("blend", "tokenizer", "pretrain", "sft"),
    "model": ("pretrain", "sft", "rl", "tokenizer"),
}
TRAINING_STAGES = ("pretrain", "sft", "rl")
"""Stages whose artifacts hold checkpoints; the model exports the last of them the experiment runs."""
TRAINING_POOL = "training"
"""The concurrency pool every training stage takes a slot of: the instance's limit says how many train at once."""
EVALUATION_POOL = "evaluation"
"""The concurrency pool of evaluation runs."""
POOL_LIMITS = {TRAINING_POOL: 1, EVALUATION_POOL: 2}
"""Slots per pool on an embedded (laptop) instance: one training stage at a time, two evaluations."""
RL_PLACEMENT = {"learners", "actors"}
"""RL knobs that say where work runs, not what it computes: left out of the fingerprint."""
SPREAD_STAGES = ("pretrain", "sft")
"""Stages placed as `resources` says: nodes x processes_per_node ranks, gpus per node."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Placement:
    """Where one stage runs: never part of its fingerprint."""

    nodes: int = 1
    processes: int = 1
    """Ranks per node."""
    gpus: int = 0
    """GPUs per node."""
    roles: Mapping[str, Any] = field(default_factory=dict)
    """Stage-specific: RL's `learners` and `actors` ranks, and the `backend` they meet over."""


def pool_of(kind: str) -> str | None:
    """The concurrency pool a stage kind takes a slot of (None: it runs unbounded)."""
    return TRAINING_POOL if kind in TRAINING_STAGES else None


def placement(experiment: Experiment, kind: str) -> Placement:
    """Training stages spread as `resources` says; RL runs its learners and actors as ranks of one node, on the CPU over
    gloo (sampling and the sandbox dominate at the sizes it serves today); every other stage is one rank."""
    if kind in SPREAD_STAGES:
        resources = experiment.resources
        return Placement(nodes=resources.nodes, processes=resources.processes_per_node, gpus=resources.gpus)
    if kind == "rl" and experiment.rl is not None:
        rl = experiment.rl
        return Placement(processes=rl.learners + rl.actors, roles={"learners": rl.learners, "actors": rl.actors, "backend": "gloo"})
    return Placement()
DATASET_STAGES = ("raw_datasets", "deduped_datasets", "filtered_datasets")
STAGES = tuple(UPSTREAM)
# Identity and prose, not recipe: two files with the same recipe have the same config hash.
NOT_RECIPE = {"name", "description", "source", "variant", "nondeterministic"}
OPTIONAL_SECTIONS = ("sft", "rl")
"""Sections added after recipes existed: left out of the config hash when absent."""


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
    seed, data = experiment.seed, dump["data"]
    datasets = {name: data["datasets"][name] for name in blended_datasets(experiment)}
    stream = {key: data[key] for key in ("shuffle_buffer_docs", "packing", "pack_window_docs")}
    match kind:
        case "raw_datasets":
            files = {name: source_files(experiment.data.datasets[name].source).digest for name in datasets}
            return {"sources": {name: d["source"] for name, d in datasets.items()}, "files": files}
        case "deduped_datasets":
            return {"dedup": {name: d["dedup"] for name, d in datasets.items()}, "seed": seed}
        case "filtered_datasets":
            keys = ("filters", "tag", "max_duplicate_share")
            return {"datasets": {name: {key: d[key] for key in keys} for name, d in datasets.items()}}
        case "blend":
            return {"blend": data["blend"], "validation_percent": data["validation_percent"]}
        case "tokenizer":
            return {"tokenizer": dump["tokenizer"], "seed": seed, "shuffle_buffer_docs": stream["shuffle_buffer_docs"]}
        case "pretrain":
            config = {"model": dump["model"], "pretrain": dump["pretrain"], "seed": seed, "stream": stream}
            if experiment.control is not None:  # only when present, so recipes without rules keep their fingerprints
                config["control"] = dump["control"]
            return config
        case "sft":
            return {"model": dump["model"], "sft": dump["sft"], "seed": seed, "stream": stream}
        case "rl":
            rl = {key: value for key, value in dump["rl"].items() if key not in RL_PLACEMENT}
            return {"model": dump["model"], "rl": rl, "seed": seed, "stream": stream}
        case "model":
            return {}
    raise ConfigError(f"unknown stage {kind!r}; stages are: {', '.join(STAGES)}")


def blended_datasets(experiment: Experiment) -> tuple[str, ...]:
    """The datasets the blend draws from, in `data.datasets` order: the only ones the data stages compute (a dataset
    defined but not blended is read by no stage, so it enters no fingerprint)."""
    used = {part.dataset for part in experiment.data.blend if part.dataset is not None}
    return tuple(name for name in experiment.data.datasets if name in used)


def upstream_of(experiment: Experiment, kind: str) -> tuple[str, ...]:
    """The stages this stage of this experiment reads: upstream stages the experiment does not run are left out."""
    stages = experiment.stages()
    return tuple(name for name in UPSTREAM[kind] if name in stages)


def plan_stage(experiment: Experiment, kind: str, upstream: Mapping[str, str]) -> StageSpec:
    """Build the spec of one stage from the experiment and its upstream artifact digests."""
    if kind in STAGES and kind not in experiment.stages():
        raise ConfigError(f"{experiment.name} has no {kind} stage: its file has no section for it")
    needed = upstream_of(experiment, kind) if kind in UPSTREAM else ()
    missing = [name for name in needed if name not in upstream]
    if missing:
        raise ConfigError(f"stage {kind!r} needs the digests of {', '.join(missing)} before it can be planned")
    return StageSpec(
        kind=kind,
        config=stage_config(experiment, kind),
        upstream={name: upstream[name] for name in needed},
        code=code_identity(experiment.image),
    )


def config_hash(experiment: Experiment) -> str:
    """Hash of the recipe: every section, placement included; the name and the prose are not."""
    absent = {name for name in OPTIONAL_SECTIONS if getattr(experiment, name) is None}  # recipes without them keep their hash
    return sha256_of(experiment.model_dump(mode="json", exclude=NOT_RECIPE | absent))[:16]
