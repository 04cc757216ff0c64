"""The built-in stage kinds, declared as a plugin declares one (`factory.config.kinds.StageKind`), in the order they run.

Each kind's `fingerprint` is the part of the experiment that changes its bytes; the run functions are named as
`module:function`, so a stage process imports only its own kind's code (a data stage never loads torch).
"""

from __future__ import annotations

from typing import Any

from factory.config.kinds import Placement, StageKind, as_resources_say
from factory.config.schema import Experiment, blended_datasets
from factory.config.sources import source_files

RL_PLACEMENT = {"learners", "actors"}
"""RL knobs that say where work runs, not what it computes: left out of the fingerprint."""
POST_TRAINING_TASKS = "code_exec_tasks"
"""The Dagster asset of the code-execution task table post-training reads."""


def _blends_a_dataset(experiment: Experiment) -> bool:
    return any(part.dataset is not None for part in experiment.data.blend)


def _datasets(experiment: Experiment) -> dict[str, Any]:
    dump = experiment.data.model_dump(mode="json")
    return {name: dump["datasets"][name] for name in blended_datasets(experiment)}


def _stream(experiment: Experiment) -> dict[str, Any]:
    data = experiment.data.model_dump(mode="json")
    return {key: data[key] for key in ("shuffle_buffer_docs", "packing", "pack_window_docs")}


def trained_model(experiment: Experiment) -> dict[str, Any]:
    """What every stage that trains (or makes) model weights is fingerprinted on, and what evaluating its checkpoints
    reads: the model's shape, the seed and how the blend is streamed."""
    return {"model": experiment.model.model_dump(mode="json"), "seed": experiment.seed, "stream": _stream(experiment)}


def _raw(experiment: Experiment) -> dict[str, Any]:
    datasets = _datasets(experiment)
    files = {name: source_files(experiment.data.datasets[name].source).digest for name in datasets}
    return {"sources": {name: d["source"] for name, d in datasets.items()}, "files": files}


def _pretrain(experiment: Experiment) -> dict[str, Any]:
    config = {"model": experiment.model.model_dump(mode="json"), "pretrain": experiment.pretrain.model_dump(mode="json"),
              "seed": experiment.seed, "stream": _stream(experiment)}
    if experiment.control is not None:  # only when present, so recipes without rules keep their fingerprints
        config["control"] = experiment.control.model_dump(mode="json")
    return config


def _rl(experiment: Experiment) -> dict[str, Any]:
    rl = {key: value for key, value in experiment.rl.model_dump(mode="json").items() if key not in RL_PLACEMENT}
    return {"model": experiment.model.model_dump(mode="json"), "rl": rl, "seed": experiment.seed, "stream": _stream(experiment)}


def _rl_placement(experiment: Experiment) -> Placement:
    """RL runs its learners and actors as ranks of one node, on the CPU over gloo (sampling and the sandbox dominate at
    the sizes it serves today)."""
    rl = experiment.rl
    return Placement(processes=rl.learners + rl.actors, roles={"learners": rl.learners, "actors": rl.actors, "backend": "gloo"})


BUILTIN_KINDS = (
    StageKind(
        name="raw_datasets", run="factory.stages.datasets:run_raw_datasets", present=_blends_a_dataset, fingerprint=_raw,
        description="Source files ingested into one Iceberg table per dataset (`raw.<name>`), each version tagged.",
        artifact=frozenset({"iceberg"}), group="data",
    ),
    StageKind(
        name="deduped_datasets", run="factory.stages.datasets:run_deduped_datasets", reads=("raw_datasets",),
        present=_blends_a_dataset, group="data", artifact=frozenset({"iceberg"}),
        fingerprint=lambda e: {"dedup": {name: d["dedup"] for name, d in _datasets(e).items()}, "seed": e.seed},
        description="Exact (sha256) and near (MinHash LSH) duplicates removed: `dedup.<name>`.",
    ),
    StageKind(
        name="filtered_datasets", run="factory.stages.datasets:run_filtered_datasets", reads=("deduped_datasets",),
        present=_blends_a_dataset, group="data", artifact=frozenset({"iceberg"}),
        fingerprint=lambda e: {"datasets": {name: {key: d[key] for key in ("filters", "tag", "max_duplicate_share")}
                                            for name, d in _datasets(e).items()}},
        description="Quality filters applied: `filtered.<name>`, checked, and tagged `v<n>` or by name only if the checks pass.",
    ),
    StageKind(
        name="blend", run="factory.stages.datasets:run_blend", reads=("filtered_datasets",), present=lambda e: True,
        group="data", artifact=frozenset({"iceberg"}),
        fingerprint=lambda e: {"blend": e.data.model_dump(mode="json")["blend"], "validation_percent": e.data.validation_percent},
        description="The training mixture: table versions with weights and modes (finite or oversample).",
    ),
    StageKind(
        name="tokenizer", run="factory.stages.runners:run_tokenizer", reads=("blend",), present=lambda e: True,
        artifact=frozenset({"tokenizers"}),
        fingerprint=lambda e: {"tokenizer": e.tokenizer.model_dump(mode="json"), "seed": e.seed,
                               "shuffle_buffer_docs": e.data.shuffle_buffer_docs},
        description="Byte-level BPE trained on a seeded sample of the blend's train split.",
    ),
    StageKind(
        name="pretrain", run="factory.stages.runners:run_pretrain", reads=("blend", "tokenizer"), section="pretrain",
        checkpoints=True, fingerprint=_pretrain, placement=as_resources_say, artifact=frozenset({"torch"}),
        description="Pretraining run: a GPT trained on packed token sequences from the blend; its kept checkpoints are "
                    "`checkpoints` partitions.",
    ),
    # Post-training reads the model it starts from; blend and tokenizer name the held-out data its evaluations read.
    StageKind(
        name="sft", run="factory.stages.post:run_sft", reads=("blend", "tokenizer", "pretrain"), section="sft",
        checkpoints=True, placement=as_resources_say, artifact=frozenset({"torch"}), extra_inputs=(POST_TRAINING_TASKS,),
        fingerprint=lambda e: {"model": e.model.model_dump(mode="json"), "sft": e.sft.model_dump(mode="json"), "seed": e.seed,
                               "stream": _stream(e)},
        description="Supervised fine-tuning of the pretrained model on code-execution pairs (loss on completions only); its "
                    "checkpoints are `checkpoints` partitions.",
    ),
    StageKind(
        name="rl", run="factory.stages.post:run_rl", reads=("blend", "tokenizer", "pretrain", "sft"), section="rl",
        checkpoints=True, fingerprint=_rl, placement=_rl_placement, artifact=frozenset({"torch"}),
        extra_inputs=(POST_TRAINING_TASKS,),
        description="GRPO from code-execution feedback, starting from the SFT model: actors sample and score, learners "
                    "update; checkpoints are `checkpoints` partitions.",
    ),
    StageKind(
        name="model", run="factory.stages.runners:run_model", reads=("pretrain", "sft", "rl", "tokenizer"),
        present=lambda e: e.pretrain is not None, fingerprint=lambda e: {}, artifact=frozenset({"torch"}),
        description="The final weights of the last training stage (rl, sft or pretrain), exported with their config and tokenizer.",
    ),
)
