"""Validation bits-per-byte: the model's code length for held-out text, independent of the tokenizer."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from tokenizers import Tokenizer

from factory.devices import device_of
from factory.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class BitsPerByte:
    """Total negative log-likelihood of the scored tokens, in bits per byte of text they cover."""

    bpb: float
    tokens: int
    bytes: int


def validation_tokens(texts: Iterable[str], tokenizer: Tokenizer, eos_id: int, max_bytes: int) -> torch.Tensor:
    """Documents in the given order, EOS after each, until `max_bytes` of text are covered."""
    ids: list[int] = []
    covered = 0
    for text in texts:
        if covered >= max_bytes:
            break
        ids.extend(tokenizer.encode(text).ids)
        ids.append(eos_id)
        covered += len(text.encode())
    if len(ids) < 2:
        raise ConfigError("the validation split is empty: raise data.validation_percent or widen the data")
    return torch.tensor(ids, dtype=torch.int64)


@torch.no_grad()
def bits_per_byte(model: nn.Module, tokens: torch.Tensor, byte_lengths: Sequence[int], context: int, batch_size: int) -> BitsPerByte:
    """Score every token after the first exactly once, in non-overlapping windows of `context`."""
    model.eval()
    lengths = torch.tensor(byte_lengths, dtype=torch.int64)
    inputs, targets = tokens[:-1], tokens[1:]
    windows = math.ceil(len(inputs) / context)
    pad = windows * context - len(inputs)
    x = F.pad(inputs, (0, pad)).view(windows, context)
    y = F.pad(targets, (0, pad), value=-100).view(windows, context)
    device = device_of(model)
    nats = torch.zeros((), dtype=torch.float64, device=device)  # summed where the logits are: one read at the end
    for start in range(0, windows, batch_size):
        xb, yb = x[start : start + batch_size].to(device), y[start : start + batch_size].to(device)
        logits = model(xb)
        nats += F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), yb.reshape(-1), ignore_index=-100, reduction="sum")
    nats = float(nats)
    covered = int(lengths[targets].sum())
    if covered == 0:
        raise ConfigError("the validation tokens cover no bytes: raise eval.max_bytes or widen the data")
    return BitsPerByte(bpb=nats / math.log(2) / covered, tokens=len(targets), bytes=covered)
