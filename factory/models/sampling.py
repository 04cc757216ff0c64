"""How the next token is chosen from a row's logits: greedy, or drawn at a temperature within a top-p nucleus.

A sampled row draws from its own `torch.Generator`, so its tokens depend on its seed and not on
which rows share its batch. With `top_p` at 1 the draw is the one the factory always made
(`multinomial` over `softmax(logits / temperature)`), so seeds give the completions they gave
before the KV cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, kw_only=True, slots=True)
class Sampling:
    """How many tokens to write, how to choose each, and what ends a row early."""

    new_tokens: int
    """At most this many tokens per row (the one that ends a row included)."""
    temperature: float = 0.0
    """0 for greedy decoding; above 0, tokens are drawn from softmax(logits / temperature) (one seed per row)."""
    top_p: float = 1.0
    """Draw only from the most likely tokens whose probabilities add up to top_p (1: from all of them)."""
    eos_id: int | None = None
    """End-of-text: writing it ends a row, and it fills a row's slots after its end where a caller needs a rectangle."""
    stop_ids: frozenset[int] = field(default_factory=frozenset)
    """Other tokens that end a row when written (RL: every token holding a newline)."""
    stop_strings: tuple[str, ...] = ()
    """Texts that end a row as soon as its generated text holds one (needs the engine's `decode`)."""

    def __post_init__(self) -> None:
        if self.new_tokens < 1:
            raise ValueError(f"new_tokens must be at least 1, not {self.new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"the temperature must be 0 (greedy) or positive, not {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p}")
        if any(not s for s in self.stop_strings):
            raise ValueError("a stop string must not be empty")

    @property
    def greedy(self) -> bool:
        """Whether every token is the most likely one."""
        return self.temperature == 0


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """`probs` (rows, vocab) with every token outside each row's top-p nucleus set to 0 (the most likely is always kept)."""
    ordered, order = probs.sort(dim=-1, descending=True)
    before = ordered.cumsum(dim=-1) - ordered  # probability of the more likely tokens
    outside = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before >= top_p)
    return probs.masked_fill(outside, 0.0)


def choose(logits: torch.Tensor, sampling: Sampling, generators: Sequence[torch.Generator | None]) -> tuple[torch.Tensor, torch.Tensor]:
    """The next token of each row of `logits` (rows, vocab) and its log-probability under softmax(logits / temperature)
    (under the logits themselves when greedy; before the top-p cut, which is what RL's ratio compares against)."""
    logits = logits.float()
    if sampling.greedy:
        picked = logits.argmax(dim=-1)
        logp = torch.log_softmax(logits, dim=-1)
    else:
        scaled = logits / sampling.temperature
        probs = torch.softmax(scaled, dim=-1)
        if sampling.top_p < 1:
            probs = nucleus(probs, sampling.top_p)
        picked = torch.cat([torch.multinomial(row, 1, generator=g) for row, g in zip(probs, generators, strict=True)])
        logp = torch.log_softmax(scaled, dim=-1)
    return picked, logp.gather(1, picked.view(-1, 1)).squeeze(1)
