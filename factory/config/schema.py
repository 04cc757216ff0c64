"""The typed experiment spec: one frozen section per component, unknown keys rejected."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._=-]{0,127}$")
IMAGE_PATTERN = re.compile(r"^[\w.\-/:]+@sha256:[0-9a-f]{64}$")


class Section(BaseModel):
    """Base of every config section: frozen, strict about unknown keys."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class DataConfig(Section):
    source: Literal["python-stdlib"] = "python-stdlib"
    """Where the corpus comes from: the running interpreter's standard library `.py` files."""
    table: str = "raw.python_stdlib"
    """Iceberg table `namespace.name` the corpus is written to."""
    validation_percent: int = Field(5, ge=1, le=50)
    """Share of files (by hash of path) held out for validation."""
    max_file_bytes: int = Field(1_000_000, gt=0)
    """Files larger than this are left out (generated tables, not code)."""

    @field_validator("table")
    @classmethod
    def _table_has_namespace(cls, value: str) -> str:
        parts = value.split(".")
        if len(parts) != 2 or not all(re.fullmatch(r"[a-z_][a-z0-9_]*", p) for p in parts):
            raise ValueError(f"expected 'namespace.table' in lower_snake_case, found {value!r}")
        return value


class TokenizerConfig(Section):
    kind: Literal["byte-bpe"] = "byte-bpe"
    """Byte-level BPE trained with the `tokenizers` library."""
    vocab_size: int = Field(4096, ge=300, le=262_144)
    """Vocabulary size, special tokens included (at least 256 bytes + specials)."""
    min_frequency: int = Field(2, ge=1)
    """A merge must occur at least this often in the training sample."""
    sample_bytes: int = Field(8_000_000, gt=0)
    """How many bytes of the train split the tokenizer learns from (seeded sample of files)."""


class ModelConfig(Section):
    n_layer: int = Field(4, ge=1, le=128)
    """Transformer blocks."""
    n_head: int = Field(4, ge=1, le=128)
    """Attention heads per block."""
    n_embd: int = Field(256, ge=8)
    """Width of the residual stream; divisible by n_head."""
    context: int = Field(256, ge=8, le=131_072)
    """Tokens of context the model sees."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout probability in attention and MLP outputs."""
    tie_embeddings: bool = True
    """Share the input embedding with the output projection."""

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        return self


class PretrainConfig(Section):
    steps: int = Field(ge=1)
    """Optimizer steps."""
    batch_size: int = Field(16, ge=1)
    """Sequences per optimizer step."""
    lr: float = Field(1e-3, gt=0, le=1.0)
    """Peak learning rate of AdamW."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    """The cosine schedule decays to lr * min_lr_ratio."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warmup from 0 to lr."""
    weight_decay: float = Field(0.1, ge=0)
    """AdamW decoupled weight decay on matrices (not on norms and biases)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    grad_clip: float = Field(1.0, ge=0)
    """Clip the global gradient norm to this (0 turns clipping off)."""
    checkpoint_every: int = Field(0, ge=0)
    """Keep a checkpoint every N steps (0: only the final one)."""
    log_every: int = Field(25, ge=1)
    """Report training metrics every N steps."""

    @model_validator(mode="after")
    def _warmup_fits(self) -> PretrainConfig:
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be below steps ({self.steps})")
        return self


class EvalConfig(Section):
    benchmarks: tuple[str, ...] = ("val_bpb",)
    """Benchmarks to run, by registered name (`factory check` verifies they exist)."""
    max_bytes: int = Field(500_000, gt=0)
    """Bytes of the validation split scored for bits-per-byte (files in path order)."""
    batch_size: int = Field(16, ge=1)
    """Windows scored per forward pass."""


class ResourcesConfig(Section):
    """Placement: where a stage runs. Excluded from fingerprints."""

    nodes: int = Field(1, ge=1)
    """Machines per training stage."""
    processes_per_node: int = Field(1, ge=1)
    """Ranks per machine."""
    queue: str = "default"
    """Scheduler queue (Volcano on a cluster)."""
    priority: str | None = None
    """Priority class name on a cluster."""
    gpus: int = Field(0, ge=0)
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
    seed: int = 0
    """Seeds every random choice of every stage."""
    data: DataConfig = DataConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    model: ModelConfig = ModelConfig()
    pretrain: PretrainConfig | None = None
    eval: EvalConfig | None = None
    resources: ResourcesConfig = ResourcesConfig()

    def stages(self) -> tuple[str, ...]:
        """The stages this experiment runs, in order: sections not present are not run."""
        stages = ["corpus", "tokenizer"]
        if self.pretrain is not None:
            stages += ["checkpoints", "model"]
            if self.eval is not None:
                stages.append("evaluation")
        return tuple(stages)

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
