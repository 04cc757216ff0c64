"""The built-in model architecture, declared without importing torch (checking an experiment reads the registry)."""

from __future__ import annotations

from factory.config.architectures import ModelArch

GPT_ARCH = ModelArch(
    name="gpt",
    description="decoder-only transformer (GPT-2 style, learned or rotary positions)",
    build="factory.models.gpt:GPT",
    export="factory.models.export:export_gpt",
)

BUILTIN_ARCHITECTURES = (GPT_ARCH,)
