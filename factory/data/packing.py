"""Token streams: documents tokenized as they stream in and packed into one long sequence."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

import torch
from tokenizers import Tokenizer

from factory.errors import ConfigError

ENCODE_BATCH_DOCS = 256


def pack_documents(texts: Iterable[str], tokenizer: Tokenizer, eos_id: int, max_tokens: int) -> torch.Tensor:
    """Tokenize documents in the order given, EOS after each, until `max_tokens` (int64); reads no further."""
    pieces: list[torch.Tensor] = []
    total = 0
    texts = iter(texts)
    while batch := list(islice(texts, ENCODE_BATCH_DOCS)):
        for encoding in tokenizer.encode_batch(batch):
            ids = encoding.ids + [eos_id]
            pieces.append(torch.tensor(ids, dtype=torch.int64))
            total += len(ids)
        if total >= max_tokens:
            break
    if not pieces:
        raise ConfigError("the train split has no documents to pack: widen the data or lower data.validation_percent")
    return torch.cat(pieces)[:max_tokens]


def sample_batch(tokens: torch.Tensor, batch_size: int, context: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of `context` tokens and their next-token targets."""
    starts = torch.randint(0, len(tokens) - context, (batch_size,), generator=generator)
    x = torch.stack([tokens[s : s + context] for s in starts.tolist()])
    y = torch.stack([tokens[s + 1 : s + 1 + context] for s in starts.tolist()])
    return x, y
