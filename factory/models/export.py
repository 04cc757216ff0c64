"""Exported weights that hash the same every time: `model.pt`, and safetensors with a sorted header."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save as save_safetensors

from factory.registry.layout import MODEL_SAFETENSORS, MODEL_WEIGHTS


def export_gpt(weights: Mapping[str, torch.Tensor], directory: Path) -> None:
    """A GPT's weights as `model.pt` and `model.safetensors`; a tied output projection is the embedding, so the
    safetensors file stores it once and says so in its metadata."""
    torch.save(weights, directory / MODEL_WEIGHTS)
    tied = "lm_head.weight" in weights and weights["lm_head.weight"].data_ptr() == weights["wte.weight"].data_ptr()
    stored = {k: v.contiguous() for k, v in weights.items() if not (tied and k == "lm_head.weight")}
    data = save_safetensors(stored, metadata={"tied_embeddings": str(tied).lower(), "format": "pt"})
    (directory / MODEL_SAFETENSORS).write_bytes(sorted_header(data))


def export_weights(weights: Mapping[str, torch.Tensor], directory: Path) -> None:
    """Any model's weights as `model.pt` and `model.safetensors`; a tensor sharing storage with an earlier one is stored
    once, and the metadata's `shared` maps each name left out to the name it is stored under."""
    torch.save(weights, directory / MODEL_WEIGHTS)
    first: dict[int, str] = {}
    shared = {name: first.setdefault(tensor.data_ptr(), name) for name, tensor in weights.items()}
    shared = {name: kept for name, kept in shared.items() if name != kept}
    stored = {k: v.contiguous() for k, v in weights.items() if k not in shared}
    data = save_safetensors(stored, metadata={"format": "pt", "shared": json.dumps(shared, sort_keys=True)})
    (directory / MODEL_SAFETENSORS).write_bytes(sorted_header(data))


def sorted_header(data: bytes) -> bytes:
    """A safetensors file with its JSON header's keys sorted: the library writes its metadata map in an order
    that changes from process to process, so the same weights would not give the same bytes twice."""
    size = int.from_bytes(data[:8], "little")
    text = json.dumps(json.loads(data[8 : 8 + size]), sort_keys=True, separators=(",", ":")).encode()
    if len(text) > size:  # not the compact JSON the library writes: leave the file as it is
        return data
    return data[:8] + text + b" " * (size - len(text)) + data[8 + size :]
