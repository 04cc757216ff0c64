"""Models built and exported through the architecture registry: what `model.arch` names, seeded."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from factory.config.architectures import architecture
from factory.config.schema import ModelConfig
from factory.models.hf_layout import HFLayout


def build_model(config: ModelConfig, vocab_size: int, seed: int) -> nn.Module:
    """A freshly initialised model of `config.arch`; the same seed gives the same weights."""
    build = architecture(config.arch).build_function()
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return build(config, vocab_size)
    finally:
        torch.random.set_rng_state(generator_state)


def new_model(config: ModelConfig, vocab_size: int) -> nn.Module:
    """A model of `config.arch` to load trained weights into (its initial weights are whatever the global generator gives)."""
    return architecture(config.arch).build_function()(config, vocab_size)


def export_model(config: ModelConfig, weights: Mapping[str, torch.Tensor], directory: Path) -> None:
    """Write trained `weights` of a `config.arch` model into `directory` as its architecture exports them."""
    architecture(config.arch).export_function()(weights, directory)


def hugging_face_layout(config: ModelConfig, weights: Mapping[str, torch.Tensor], vocab_size: int) -> HFLayout | str:
    """Trained `weights` in the Hugging Face layout of `config.arch`, or a line saying why the model has none."""
    arch = architecture(config.arch)
    layout = arch.hugging_face_function()
    if layout is None:
        return f"arch {arch.name} ({arch.origin}) declares no Hugging Face layout"
    return layout(config, weights, vocab_size)


def count_parameters(model: nn.Module) -> int:
    """Parameters, counting tied weights once."""
    return sum(p.numel() for p in model.parameters())
