"""The experiment file's `model` section: the architecture and its shape, checked against what the architecture reads."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from factory.config.architectures import DEFAULT_ARCH, SHAPE_FIELDS, architecture, architectures, unknown_architecture
from factory.config.section import Section

LEFT_OUT_AT_DEFAULT = ("arch", "n_kv_head", "rope_theta", "norm_eps", "intermediate_size")
"""Fields added after recipes were written: left out of the dump (so of every fingerprint) while they hold their
default, so the recipes written before them keep their fingerprints."""


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
        given = self.model_fields_set - SHAPE_FIELDS
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
