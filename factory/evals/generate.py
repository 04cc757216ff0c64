"""Batched autoregressive generation for the benchmarks: greedy, or seeded temperature sampling.

Every prompt in a batch has the same token length, so no padding is needed. There is no KV cache:
the models the benchmarks see are small, and one forward pass per new token keeps the code plain.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch
from torch import nn


@torch.no_grad()
def _extend(
    model: nn.Module, prompts: torch.Tensor, new_tokens: int, context: int, choose: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """The `new_tokens` ids picked by `choose` from each row's next-token logits, (batch, new_tokens)."""
    model.eval()
    idx = prompts
    for _ in range(new_tokens):
        logits = model(idx[:, -context:])[:, -1, :].float()
        idx = torch.cat([idx, choose(logits).view(-1, 1)], dim=1)
    return idx[:, prompts.size(1) :]


def greedy(model: nn.Module, prompts: torch.Tensor, new_tokens: int, context: int) -> torch.Tensor:
    """Extend each row of `prompts` (batch, time) by its most likely token, `new_tokens` times."""
    return _extend(model, prompts, new_tokens, context, lambda logits: logits.argmax(dim=-1))


def sample(
    model: nn.Module, prompts: torch.Tensor, new_tokens: int, context: int, temperature: float, seeds: Sequence[int]
) -> torch.Tensor:
    """Extend each row of `prompts` by tokens drawn at `temperature`, row i from a generator seeded with `seeds[i]`.

    One generator per row makes a row's tokens independent of which rows share its batch.
    """
    if len(seeds) != prompts.size(0):
        raise ValueError(f"need one seed per row; got {len(seeds)} seeds for {prompts.size(0)} rows")
    if temperature <= 0:
        raise ValueError(f"the temperature must be positive, not {temperature}")
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]

    def draw(logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits / temperature, dim=-1)
        return torch.cat([torch.multinomial(row, 1, generator=g) for row, g in zip(probs, generators, strict=True)])

    return _extend(model, prompts, new_tokens, context, draw)


def same_length_batches(prompts: list[list[int]], batch_size: int) -> list[list[int]]:
    """Prompt indices in batches of at most `batch_size` whose prompts have the same token length (no padding needed)."""
    by_length = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    groups = [list(group) for _, group in itertools.groupby(by_length, key=lambda i: len(prompts[i]))]
    return [group[start : start + batch_size] for group in groups for start in range(0, len(group), batch_size)]
