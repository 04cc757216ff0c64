"""The experiment file's `model` section: the architecture and its shape, checked against what the architecture reads."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from factory.config.architectures import DEFAULT_ARCH, SHAPE_FIELDS, architecture, architectures, unknown_architecture
from factory.config.hf_checkpoint import read_checkpoint
from factory.config.section import Section
from factory.errors import ConfigError

LEFT_OUT_AT_DEFAULT = ("arch", "n_kv_head", "rope_theta", "norm_eps", "intermediate_size", "from_hf")
"""Fields added after recipes were written: left out of the dump (so of every fingerprint) while they hold their
default, so the recipes written before them keep their fingerprints."""


FREE_OF_THE_CHECKPOINT = ("dropout", "positions")
"""Fields a model that starts from a Hugging Face checkpoint may set as it likes (`context` may only shrink)."""


class HFSource(Section):
    """What `model.from_hf: <directory>` becomes when the file is read (a file gives the path alone): the path as written
    and the digest of the directory's files."""

    path: str
    """The directory (relative paths start at the working directory)."""
    files: str
    """The digest of the sha256 of every file in it: fingerprints hold it, so a changed file makes the stages run again."""


class _Unreadable(str):
    """A `from_hf` path that could not be read, carried with why to its field's validator (so the error points at
    `model.from_hf`)."""

    why: str


class ModelConfig(Section):
    """The model: its architecture and shape."""

    arch: str = DEFAULT_ARCH
    """The model architecture: `gpt` (a GPT-2 style transformer), `llama` (RMSNorm, SwiGLU, rotary positions,
    grouped-query attention, no biases), or one an installed plugin registers."""
    n_layer: int = Field(4, ge=1, le=128)
    """Transformer blocks."""
    n_head: int = Field(4, ge=1, le=128)
    """Attention heads per block."""
    n_embd: int = Field(256, ge=8, le=65_536)
    """Width of the residual stream; divisible by n_head."""
    context: int = Field(256, ge=8, le=131_072)
    """Tokens of context the model sees."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout probability in attention and MLP outputs."""
    tie_embeddings: bool = True
    """Share the input embedding with the output projection."""
    positions: Literal["learned", "rotary"] = "learned"
    """Learned position embeddings (GPT-2), or rotary embeddings applied to queries and keys (RoPE); llama: always rotary."""
    n_kv_head: int | None = Field(None, ge=1, le=128)
    """llama: key/value heads of grouped-query attention, dividing n_head (null: n_head, plain multi-head attention)."""
    rope_theta: float = Field(10_000.0, gt=0, le=1e9)
    """llama: the base of the rotary angles (larger: slower rotation, longer contexts)."""
    norm_eps: float = Field(1e-5, gt=0, le=1e-1)
    """llama: the epsilon of RMSNorm."""
    intermediate_size: int | None = Field(None, ge=1, le=1_048_576)
    """llama: width of the SwiGLU MLP (null: 8/3 of n_embd, rounded up to a multiple of 32)."""
    from_hf: HFSource | None = None
    """A Hugging Face `LlamaForCausalLM` checkpoint directory on this machine to start from (written as its path; nothing is
    downloaded): its `config.json` gives the shape (fields given here must agree; `context` may be shorter), its tokenizer
    replaces the tokenizer stage's, and pretraining (or sft, or rl: the first training stage) starts from its weights."""

    @field_validator("from_hf", mode="before")
    @classmethod
    def _readable(cls, value: Any) -> Any:
        if isinstance(value, _Unreadable):
            raise ValueError(value.why)
        return value

    @model_validator(mode="before")
    @classmethod
    def _shape_of_the_checkpoint(cls, data: Any) -> Any:
        """A `from_hf` written as a path: read the checkpoint, take its shape, and record the digest of its files."""
        if not isinstance(data, dict) or not isinstance(data.get("from_hf"), str):
            return data
        path = data["from_hf"]
        try:
            checkpoint = read_checkpoint(path)
        except ConfigError as e:
            unreadable = _Unreadable(path)
            unreadable.why = str(e)
            return {**data, "from_hf": unreadable}
        for key, value in checkpoint.shape.items():
            given = data.get(key, value)
            fits = given <= value if key == "context" and isinstance(given, int) else given == value
            if not fits:
                if key == "context":
                    raise ValueError(f"model.context is {given!r}, but {checkpoint.root}/config.json gives at most {value!r} "
                                     "positions: lower model.context or remove it")
                raise ValueError(f"model.{key} is {given!r}, but {checkpoint.root}/config.json gives {value!r}: a model that "
                                 f"starts from a checkpoint keeps its shape; remove model.{key}")
        unknown = sorted(set(data) - set(checkpoint.shape) - {"from_hf", *FREE_OF_THE_CHECKPOINT})
        if unknown:
            raise ValueError(f"model.{unknown[0]}: the shape comes from model.from_hf ({checkpoint.root}/config.json); remove it")
        return {**architecture("llama").defaults, **checkpoint.shape, **data, "from_hf": {"path": path, "files": checkpoint.digest}}

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, arch: str) -> str:
        if arch not in {a.name for a in architectures()}:
            raise ValueError(unknown_architecture(arch))
        return arch

    @model_validator(mode="before")
    @classmethod
    def _arch_defaults(cls, data: Any) -> Any:
        """Fill what the architecture fixes (llama: rotary positions) where the file says nothing."""
        if not isinstance(data, dict) or data.get("arch", DEFAULT_ARCH) == DEFAULT_ARCH:  # the default fixes nothing
            return data
        if data["arch"] not in {a.name for a in architectures()}:
            return data
        return {**architecture(data["arch"]).defaults, **data}

    @model_serializer(mode="wrap")
    def _later_fields_only_when_set(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dump = handler(self)
        for name in LEFT_OUT_AT_DEFAULT:  # recipes written before these fields existed keep their fingerprints
            if getattr(self, name) == type(self).model_fields[name].default:
                dump.pop(name, None)
        return dump

    @model_validator(mode="after")
    def _shape_fits(self) -> ModelConfig:
        self._only_what_the_arch_reads()
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_kv_head is not None and self.n_head % self.n_kv_head:
            raise ValueError(f"n_head ({self.n_head}) must be divisible by n_kv_head ({self.n_kv_head}): each key/value head "
                             "serves the same number of query heads")
        if self.positions == "rotary" and (self.n_embd // self.n_head) % 2:
            raise ValueError(f"rotary positions need an even head width; n_embd / n_head is {self.n_embd // self.n_head}")
        return self

    def _only_what_the_arch_reads(self) -> None:
        """A field the architecture does not read must keep its default (or the value the architecture fixes)."""
        given = self.model_fields_set - SHAPE_FIELDS - {"from_hf"}  # the checkpoint fixes the arch it is read into
        if not given:  # nothing to check, and the registry is not read (the schema's own defaults are built on import)
            return
        arch = architecture(self.arch)
        if arch.options is None:
            return
        for name in sorted(given - arch.options):
            expected = arch.defaults.get(name, type(self).model_fields[name].default)
            if getattr(self, name) != expected:
                fixed = f"arch {self.arch} always has {name} {expected!r}" if name in arch.defaults else f"it does not apply to arch {self.arch}"
                reads = ", ".join(sorted(arch.options)) or "none"
                raise ValueError(f"{name} is {getattr(self, name)!r}, but {fixed}; remove it (the options arch {self.arch} reads "
                                 f"beyond the shape: {reads})")

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_head, or n_head when it is unset."""
        return self.n_kv_head or self.n_head

    @property
    def mlp_width(self) -> int:
        """Width of a llama's SwiGLU MLP: intermediate_size, or 8/3 of n_embd rounded up to a multiple of 32."""
        if self.intermediate_size is not None:
            return self.intermediate_size
        return -(-8 * self.n_embd // 96) * 32  # ceil(8 n / 3 / 32) * 32
