"""The typed experiment spec: one frozen section per component, unknown keys rejected."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from factory.config.base_refs import FORMS, BaseRef, base_ref
from factory.config.control import ControlConfig
from factory.config.data_sections import DataConfig
from factory.config.limits import MAX_BATCH, MAX_BYTES, MAX_COUNT, MAX_RANKS, MAX_STEPS, Beta
from factory.config.model_section import ModelConfig
from factory.config.section import GrownSection, Section
from factory.config.sft_data import SFTData
from factory.config.table_refs import table_ref

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._=-]{0,127}$")
IMAGE_PATTERN = re.compile(r"^[\w.\-/:]+@sha256:[0-9a-f]{64}$")


class TokenizerConfig(Section):
    """The tokenizer trained on a sample of the blend's train split."""

    kind: Literal["byte-bpe"] = "byte-bpe"
    """Byte-level BPE trained with the `tokenizers` library."""
    vocab_size: int = Field(4096, ge=300, le=262_144)
    """Vocabulary size, special tokens included (at least 256 bytes + specials)."""
    min_frequency: int = Field(2, ge=1, le=MAX_COUNT)
    """A merge must occur at least this often in the training sample."""
    sample_bytes: int = Field(8_000_000, gt=0, le=MAX_BYTES)
    """How many bytes of the train split the tokenizer learns from (seeded sample of files)."""


class PretrainConfig(GrownSection):
    """Pretraining from scratch on the blend: AdamW with linear warmup and cosine decay, checkpoints and their retention."""

    DEFAULT_LEFT_OUT = ("parallelism", "reshard_after_forward", "activation_checkpointing", "activation_checkpoint_every",
                        "checkpoint_at_start")  # recipes written before these fields keep their fingerprints

    steps: int = Field(ge=1, le=MAX_STEPS)
    """Optimizer steps."""
    batch_size: int = Field(16, ge=1, le=MAX_BATCH)
    """Sequences per optimizer step."""
    lr: float = Field(1e-3, gt=0, le=1.0)
    """Peak learning rate of AdamW."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    """The cosine schedule decays to lr * min_lr_ratio."""
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS)
    """Linear warmup from 0 to lr."""
    weight_decay: float = Field(0.1, ge=0, le=10)
    """AdamW decoupled weight decay on matrices (not on norms and biases)."""
    betas: tuple[Beta, Beta] = (0.9, 0.95)
    """AdamW betas."""
    grad_clip: float = Field(1.0, ge=0, le=1e6)
    """Clip the global gradient norm to this (0 turns clipping off)."""
    checkpoint_every: int = Field(0, ge=0, le=MAX_STEPS)
    """Save a checkpoint every N steps (0: only the final one); a relaunched stage resumes from the latest."""
    checkpoint_at_start: bool = False
    """Also save the weights the stage starts from as the checkpoint of step 0 (kept by retention), so that they are
    evaluated like every other checkpoint: what a fine-tuning of an imported or base model bought, from its own curve."""
    keep_last: int = Field(2, ge=1, le=10_000)
    """Checkpoints kept besides the best and the final one; older ones are deleted (and the deletion logged)."""
    keep_best_by: Literal["loss"] | None = "loss"
    """Also keep the checkpoint with the lowest mean training loss since the checkpoint before it (null: no best)."""
    async_checkpoints: bool = False
    """Write checkpoints on a background thread: the step loop only waits for a copy of the state."""
    checkpoint_format: Literal["file", "sharded"] = "file"
    """`file`: one `step_<n>.pt` written by rank 0. `sharded`: a directory written through torch.distributed.checkpoint,
    every rank writing its share of the (replicated) state, so no rank writes it all."""
    grad_accum_steps: int = Field(1, ge=1, le=MAX_BATCH)
    """Micro-batches per optimizer step: batch_size sequences are split into this many forward/backward passes."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """`bf16` autocast, `fp32`, or `auto`: bf16 on a GPU that supports it, fp32 otherwise."""
    compile: bool = False
    """Compile the model with torch.compile."""
    log_every: int = Field(25, ge=1, le=MAX_STEPS)
    """Report training metrics every N steps."""
    parallelism: Literal["ddp", "fsdp"] = "ddp"
    """`ddp`: every rank holds the whole model and optimizer state; gradients are averaged over the ranks. `fsdp`: FSDP2
    (`fully_shard`) shards every transformer block and the rest of the model over the ranks, so each holds 1/N of the
    parameters, gradients and optimizer state (bf16 parameters with fp32 gradient reductions on a GPU that has bf16, fp32
    elsewhere); it needs `checkpoint_format: sharded`. Checkpoints of either resume under the other, on any number of ranks.
    Part of the fingerprint when `fsdp`: its reduce-scatter and its sharded gradient norm round in another order than DDP's
    all-reduce, so the weights differ in their last bits; `ddp` is left out, so recipes written before keep theirs."""
    reshard_after_forward: bool = True
    """With `fsdp`: free each block's gathered parameters after its forward and gather them again for the backward (less
    memory, more communication); false keeps them to the backward. The same weights either way; in the fingerprint only
    when false (a needless cache miss at worst)."""
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    """Keep no activations inside a transformer block and compute them again in the backward pass, trading compute for
    memory: `full` for every block, `selective` for every `activation_checkpoint_every`-th one. The same weights either
    way (the recomputation replays the same random numbers); in the fingerprint only when not `none`."""
    activation_checkpoint_every: int = Field(2, ge=1, le=128)
    """With `activation_checkpointing: selective`: recompute blocks 0, N, 2N, ..."""

    @model_validator(mode="after")
    def _warmup_fits(self) -> PretrainConfig:
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be below steps ({self.steps})")
        if self.batch_size % self.grad_accum_steps:
            raise ValueError(f"batch_size ({self.batch_size}) must be divisible by grad_accum_steps ({self.grad_accum_steps})")
        if self.parallelism == "fsdp" and self.checkpoint_format != "sharded":
            raise ValueError("parallelism: fsdp saves each rank's shard of the state: set checkpoint_format: sharded")
        if self.parallelism != "fsdp" and not self.reshard_after_forward:
            raise ValueError("reshard_after_forward applies to parallelism: fsdp only: remove it, or set parallelism: fsdp")
        if "activation_checkpoint_every" in self.model_fields_set and self.activation_checkpointing != "selective":
            raise ValueError("activation_checkpoint_every applies to activation_checkpointing: selective only")
        return self


class TrainingSection(PretrainConfig):
    """The section of a training kind (`factory.plugin.training_kind`): the schedule, clipping, accumulation, checkpoint,
    precision and parallelism knobs every training stage has, meaning what they mean under `pretrain`, and `from`."""

    model_config = ConfigDict(serialize_by_alias=True)  # `from`, as the file writes it
    UNSET_LEFT_OUT = ("from_",)

    from_: BaseRef = None
    """Start from a model made elsewhere instead of this file's training stages: `experiments/<file>.md#model` (read at the
    same commit; `<file>.md@<variant>#model` for one variant of a sweep), `alias:<name>` (what the alias names when the
    file is planned) or `model@<sha256>`. The file then has no tokenizer or pretrain of its own: it uses the base model's
    tokenizer, shape and held-out data."""
    lr: float = Field(1e-5, gt=0, le=1.0)
    """Peak learning rate of AdamW."""
    keep_best_by: Literal["loss"] | None = None
    """Also keep the checkpoint with the lowest mean training loss since the checkpoint before it (null: no best)."""

    @field_validator("from_")
    @classmethod
    def _from_is_a_ref(cls, value: str | None) -> str | None:
        return base_ref(value)


TASKS_REF = "post.code_exec_tasks@v1"
TASK_COLUMNS = ("id", "function", "call", "expected", "split")
"""What post-training reads of a task table: a pinned version without them is refused by `factory check`."""


class SFTConfig(TrainingSection):
    """Supervised fine-tuning of the pretrained model on prompt/completion pairs; the loss counts completion tokens only.

    The pairs are the train split of a code-execution task table: the prompt is the function and
    `assert <call> ==`, the completion is the executed output and a newline. With `data`, they are
    instead the rows of any table version, rendered by a chat template. Every pretrain knob
    (schedule, clipping, accumulation, checkpoints, precision) means the same here.
    """

    UNSET_LEFT_OUT = ("data", "from_")  # recipes on the task table, or on this file's pretraining, keep their fingerprints

    lr: float = Field(3e-4, gt=0, le=1.0)
    """Peak learning rate of AdamW (lower than pretraining's: the model already knows code)."""
    tasks: str = TASKS_REF
    """The task table version whose train split gives the pairs (`namespace.table@tag`; materialize `code_exec_tasks`)."""
    data: SFTData | None = None
    """Fine-tune on any table version instead of the task table (null: the task table of `tasks`)."""

    @field_validator("tasks")
    @classmethod
    def _tasks_is_a_ref(cls, value: str) -> str:
        return table_ref(value)

    @model_validator(mode="after")
    def _one_dataset(self) -> SFTConfig:
        if self.data is not None and self.tasks != TASKS_REF:
            raise ValueError("give either 'tasks' (a code-execution task table) or 'data' (any table), not both")
        return self


class RLConfig(GrownSection):
    """Reinforcement learning from code-execution feedback (GRPO), starting from the SFT model (or the pretrained one).

    Each step samples `group_size` completions for each of `prompts_per_step` train-split tasks;
    a completion earns 1 when executing `assert <call> == <its answer>` in the sandbox passes
    (the answer must be a Python literal), plus `format_reward` when it is a literal on one line.
    Advantages are normalised within each group; the objective is PPO's clipped ratio with a KL
    penalty to the starting (reference) model.
    """

    model_config = ConfigDict(serialize_by_alias=True)  # `from`, as the file writes it
    UNSET_LEFT_OUT = ("from_",)  # recipes that start from this file's own models keep their fingerprints

    from_: BaseRef = None
    """Start from a model made elsewhere instead of this file's sft (or pretraining): as `sft.from`."""
    steps: int = Field(ge=1, le=MAX_STEPS)
    """Policy updates."""
    prompts_per_step: int = Field(8, ge=1, le=MAX_BATCH)
    """Tasks sampled per step (each with its group of completions)."""
    group_size: int = Field(8, ge=2, le=4096)
    """Completions per task (G): advantages are normalised within a group."""
    lr: float = Field(2e-5, gt=0, le=1.0)
    """Learning rate of AdamW (constant after warmup)."""
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS)
    """Linear warmup from 0 to lr."""
    weight_decay: float = Field(0.0, ge=0, le=10)
    """AdamW decoupled weight decay on matrices."""
    betas: tuple[Beta, Beta] = (0.9, 0.95)
    """AdamW betas."""
    grad_clip: float = Field(1.0, ge=0, le=1e6)
    """Clip the global gradient norm to this (0 turns clipping off)."""
    clip: float = Field(0.2, gt=0, lt=1)
    """PPO clip range: the probability ratio is clipped to [1 - clip, 1 + clip]."""
    kl: float = Field(0.02, ge=0, le=1e3)
    """Weight of the KL penalty to the reference model."""
    temperature: float = Field(1.0, gt=0, le=100)
    """Sampling temperature of the actors (log-probabilities are taken at the same temperature)."""
    max_new_tokens: int = Field(16, ge=1, le=131_072)
    """Tokens a completion may have at most; it ends at its first newline or end of text."""
    format_reward: float = Field(0.1, ge=0, le=1)
    """Reward for an answer that is a Python literal on one line, right or wrong."""
    updates_per_batch: int = Field(1, ge=1, le=1000)
    """Optimizer updates on each batch of rollouts (after the first, the ratio to the sampling policy moves off 1)."""
    sync_every: int = Field(1, ge=1, le=MAX_STEPS)
    """The learners push their weights to the actors every N updates (the actors lag by up to N - 1 versions)."""
    learners: int = Field(1, ge=1, le=MAX_RANKS)
    """Learner ranks (placement: not part of the fingerprint)."""
    actors: int = Field(1, ge=0, le=MAX_RANKS)
    """Actor ranks that generate and score rollouts (0: the learners generate; placement, not in the fingerprint)."""
    checkpoint_every: int = Field(0, ge=0, le=MAX_STEPS)
    """Save a checkpoint every N steps (0: only the final one); a multiple of sync_every, so a resumed run is exact."""
    keep_last: int = Field(2, ge=1, le=10_000)
    """Checkpoints kept besides the final one."""
    log_every: int = Field(5, ge=1, le=MAX_STEPS)
    """Report RL metrics every N steps."""
    tasks: str = TASKS_REF
    """The task table version whose train split gives the prompts."""
    sandbox_seconds: float = Field(2.0, gt=0, le=60)
    """Wall-time limit of one reward execution."""

    @field_validator("tasks")
    @classmethod
    def _tasks_is_a_ref(cls, value: str) -> str:
        return table_ref(value)

    @field_validator("from_")
    @classmethod
    def _from_is_a_ref(cls, value: str | None) -> str | None:
        return base_ref(value)

    @model_validator(mode="after")
    def _knobs_fit(self) -> RLConfig:
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be below steps ({self.steps})")
        for every in ("sync_every", "log_every"):  # a resumed run pushes and logs as an uninterrupted one
            if self.checkpoint_every % getattr(self, every):
                raise ValueError(f"checkpoint_every ({self.checkpoint_every}) must be a multiple of {every} ({getattr(self, every)})")
        groups = self.prompts_per_step
        if groups % self.learners:
            raise ValueError(f"prompts_per_step ({groups}) must be divisible by learners ({self.learners})")
        if self.actors and groups % self.actors:
            raise ValueError(f"prompts_per_step ({groups}) must be divisible by actors ({self.actors})")
        return self


class EvalConfig(Section):
    """How this experiment's checkpoints are evaluated (each checkpoint x benchmark is an `evaluations` partition)."""

    benchmarks: tuple[str, ...] = ("val_bpb",)
    """Benchmarks every checkpoint is evaluated on as it is saved, by registered name (`factory check` verifies them)."""
    max_bytes: int = Field(500_000, gt=0, le=MAX_BYTES)
    """Bytes of held-out text a benchmark reads at most."""
    batch_size: int = Field(16, ge=1, le=MAX_BATCH)
    """Sequences per forward pass (does not change scores)."""
    primary: str | None = None
    """The benchmark that ranks this experiment's models on the leaderboard and decides `best_model`; one of `benchmarks`
    (unset: `heldout_bpb`, or `val_bpb` on a board without heldout_bpb results). Recorded with each checkpoint as it is
    saved; `factory leaderboard --benchmark` ranks any board by another."""

    @field_validator("primary")
    @classmethod
    def _primary_is_evaluated(cls, value: str | None, info: ValidationInfo) -> str | None:
        benchmarks = info.data.get("benchmarks")
        if value is not None and benchmarks is not None and value not in benchmarks:
            raise ValueError(f"{value!r} is not one of eval.benchmarks ({', '.join(benchmarks)}): add it there, or rank by one of those")
        return value


class ResourcesConfig(Section):
    """Placement: where a stage runs. Excluded from fingerprints."""

    nodes: int = Field(1, ge=1, le=MAX_RANKS)
    """Machines per training stage."""
    processes_per_node: int = Field(1, ge=1, le=1024)
    """Ranks per machine."""
    queue: str = "default"
    """Scheduler queue (Volcano on a cluster)."""
    priority: str | None = None
    """Priority class name on a cluster."""
    gpus: int = Field(0, ge=0, le=64)
    """GPUs per node (0: CPU only)."""


class Experiment(Section):
    """One experiment file: the recipe of every stage, plus placement."""

    name: str
    """Partition key and display name; defaults to the file's stem (plus the sweep values of a variant)."""
    description: str = ""
    """The Markdown body: why the recipe is what it is."""
    source: str = ""
    """The file this experiment was read from (set by the loader)."""
    variant: dict[str, Any] = {}
    """For a sweep variant, the dotted paths and values that make it one (set by the loader)."""
    image: str = "local"
    """Code identity: `name@sha256:<digest>`, or `local` for the source tree on this machine."""
    nondeterministic: str | None = None
    """Why this recipe's models cannot be reproduced bit for bit (e.g. nondeterministic GPU kernels); set, it lets
    `factory promote` go ahead without a matching reproduction. Not part of the recipe's hash."""
    seed: int = Field(0, ge=0, lt=2**63)
    """Seeds every random choice of every stage."""
    data: DataConfig = DataConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    model: ModelConfig = ModelConfig()
    pretrain: PretrainConfig | None = None
    sft: SFTConfig | None = None
    """Fine-tuning of the pretrained model on code-execution pairs or any table (`factory.post.sft`)."""
    rl: RLConfig | None = None
    """GRPO from execution feedback, after sft (or pretrain) (`factory.post.grpo`)."""
    eval: EvalConfig | None = None
    control: ControlConfig | None = None
    """Rules evaluated inside the pretraining loop (`factory.train.control`)."""
    resources: ResourcesConfig = ResourcesConfig()
    export: str | None = None
    """The training stage whose final weights the model stage exports (null: the last one of the chain); needed when two
    end it, neither reading the other."""
    bound: dict[str, str] = {}
    """What the file's `from` resolved to when it was planned: the digests of the base model and of the blend and
    tokenizer it was trained with, by the name of the input they stand for (set by `factory.ops.bases.bind`)."""

    @property
    def base(self) -> tuple[str, str] | None:
        """(section, reference) of the training stage that starts from a model made elsewhere, if one does."""
        for section in type(self).model_fields:  # built-in sections first (sft before rl), then the plugins' training kinds
            config = getattr(self, section)
            if isinstance(config, Section) and getattr(config, "from_", None) is not None:
                return section, config.from_
        return None

    @field_validator("sft", "rl")
    @classmethod
    def _post_training_has_a_base(cls, value: SFTConfig | RLConfig | None, info: ValidationInfo) -> SFTConfig | RLConfig | None:
        """A post-training stage starts from this file's pretraining (or sft), or from a model its `from` names: one of them."""
        if value is None:
            return value
        pretrain, sft = info.data.get("pretrain"), info.data.get("sft") if info.field_name == "rl" else None
        model = info.data.get("model")
        imported = model is not None and model.from_hf is not None
        if value.from_ is None:
            if pretrain is None and not imported and model is not None and (sft is None or sft.from_ is None):  # None: refused already
                raise ValueError(f"'{info.field_name}' fine-tunes a model: add a 'pretrain' section, start from a Hugging Face "
                                 f"checkpoint with 'model.from_hf', or from a model made elsewhere with '{info.field_name}.from' ({FORMS})")
            return value
        if imported:
            raise ValueError(f"{info.field_name}.from: the file starts from the checkpoint model.from_hf names; keep one of the two")
        if sft is not None:
            raise ValueError("rl.from: rl starts from this file's sft; give 'from' to sft instead (the first post-training stage)")
        if pretrain is not None:
            raise ValueError(f"{info.field_name}.from: the file starts from {value.from_}, so its pretrain trains nothing it uses; "
                             "remove 'pretrain' (or 'from')")
        if info.data.get("tokenizer", TokenizerConfig()) != TokenizerConfig():
            raise ValueError(f"{info.field_name}.from: the file starts from {value.from_} and uses that model's tokenizer; remove the "
                             "'tokenizer' section")
        return value

    @model_validator(mode="after")
    def _tokenizer_of_the_checkpoint(self) -> Experiment:
        if self.model.from_hf is not None and self.tokenizer != TokenizerConfig():
            raise ValueError(f"tokenizer: the model starts from {self.model.from_hf.path}, whose tokenizer it keeps; remove the "
                             "'tokenizer' section")
        return self

    @model_validator(mode="after")
    def _something_to_pretrain_on(self) -> Experiment:
        if not self.data.blend and self.base is None:  # a file that starts from a base model has the base's blend
            raise ValueError("data: every dataset keeps row columns (for sft.data), so the default blend is empty: name the "
                             "datasets or pinned tables to pretrain on in 'data.blend'")
        return self

    @model_validator(mode="after")
    def _room_for_the_prompt(self) -> Experiment:
        if self.rl is not None and self.rl.max_new_tokens > self.model.context // 2:
            raise ValueError(f"rl.max_new_tokens ({self.rl.max_new_tokens}) must leave room for the prompt: at most half of "
                             f"model.context ({self.model.context})")
        return self

    @field_validator("name")
    @classmethod
    def _name_is_a_key(cls, value: str) -> str:
        if not NAME_PATTERN.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a valid experiment name: use lowercase letters, digits, '.', '_', '=' "
                "and '-', starting with a letter or digit, at most 128 characters"
            )
        return value

    @field_validator("image")
    @classmethod
    def _image_is_pinned(cls, value: str) -> str:
        if value != "local" and not IMAGE_PATTERN.fullmatch(value):
            raise ValueError(f"expected 'local' or an image pinned by digest (name@sha256:<64 hex>), found {value!r}")
        return value


def blended_datasets(experiment: Experiment) -> tuple[str, ...]:
    """The datasets the blend draws from, in `data.datasets` order: the only ones the data stages compute (a dataset
    defined but not blended is read by no stage, so it enters no fingerprint)."""
    if experiment.base is not None:  # it trains on no blend: the base model's is its held-out data
        return ()
    used = {part.dataset for part in experiment.data.blend if part.dataset is not None}
    return tuple(name for name in experiment.data.datasets if name in used)


class StreamSettings(Section):
    """How a training stage streams the blend (from the data section): part of what it is fingerprinted on."""

    shuffle_buffer_docs: int
    packing: Literal["best-fit", "next-fit"]
    pack_window_docs: int

    @classmethod
    def of(cls, data: DataConfig) -> StreamSettings:
        return cls(shuffle_buffer_docs=data.shuffle_buffer_docs, packing=data.packing, pack_window_docs=data.pack_window_docs)


class TrainedModel(Section):
    """The settings every stage kind with checkpoints has: the model's shape, the seed and how the blend streams. Its
    checkpoints are evaluated with them (the model to build, the held-out split to read)."""

    model: ModelConfig
    seed: int
    stream: StreamSettings

    @classmethod
    def fields_of(cls, experiment: Experiment) -> dict[str, Any]:
        """These settings of `experiment`, as keyword arguments for a subclass."""
        return {"model": experiment.model, "seed": experiment.seed, "stream": StreamSettings.of(experiment.data)}
