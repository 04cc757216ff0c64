"""The built-in model architectures, declared without importing torch (checking an experiment reads the registry)."""

from __future__ import annotations

from factory.config.architectures import ModelArch

GPT_ARCH = ModelArch(
    name="gpt",
    description="decoder-only transformer (GPT-2 style, learned or rotary positions)",
    build="factory.models.gpt:GPT",
    export="factory.models.export:export_gpt",
    hugging_face="factory.models.hf_layout:gpt2_layout",
    options=frozenset({"positions"}),
)

LLAMA_ARCH = ModelArch(
    name="llama",
    description="decoder-only transformer of the Llama family (RMSNorm, SwiGLU, rotary positions, grouped-query attention)",
    build="factory.models.llama:Llama",
    hugging_face="factory.models.hf_layout:llama_layout",
    options=frozenset({"n_kv_head", "rope_theta", "norm_eps", "intermediate_size"}),
    defaults={"positions": "rotary"},
)

BUILTIN_ARCHITECTURES = (GPT_ARCH, LLAMA_ARCH)
"""Models built and exported through the architecture registry: what `model.arch` names, seeded."""
