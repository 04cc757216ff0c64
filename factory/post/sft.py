"""Supervised fine-tuning data: tokenized examples as batches whose loss counts completion tokens only.

The examples are a split of a code-execution task table, or the rows of any table rendered by a chat
template (`factory.post.chat`). Each example is its text segments' tokens (encoded apart, so a prompt
is exactly what the benchmark shows the model), each completion followed by the end-of-text token;
targets outside completions are PAD, which the loss ignores. Epochs go
through the examples in a seeded order, a fresh order each epoch; the position in the stream is
the number of examples consumed, so a resumed run sees the batches an uninterrupted one would.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from pyiceberg.catalog import Catalog
from tokenizers import Tokenizer

from factory.data.loader import PAD, Batch, LoaderState
from factory.data.tables import parse_ref, resolve
from factory.errors import ArtifactError, ConfigError
from factory.post.format import completion, prompt


@dataclass(frozen=True, kw_only=True, slots=True)
class Example:
    """One tokenized example: `ids`, and for each whether the loss counts it (a completion's or an assistant turn's)."""

    id: str
    ids: tuple[int, ...]
    trained: tuple[bool, ...]

    @property
    def prompt_tokens(self) -> int:
        """How many tokens come before the first one the loss counts."""
        return self.trained.index(True)


def read_tasks(catalog: Catalog, ref: str, split: str) -> list[dict]:
    """The rows of one split of a pinned task table version, in id order; a clear error when it is missing or empty."""
    table, tag = parse_ref(ref)
    try:
        snapshot = resolve(catalog, table, tag)
    except ArtifactError as e:
        raise ConfigError(f"{e}: materialize the code_exec_tasks asset first (Dagster UI, group post)") from e
    scan = catalog.load_table(table).scan(row_filter=f"split == '{split}'", snapshot_id=snapshot)
    rows = scan.to_arrow().sort_by("id").to_pylist()
    if not rows:
        raise ConfigError(f"{ref} has no {split} tasks: generate more functions")
    return rows


def encode_segments(key: str, segments: list[tuple[str, bool]], tokenizer: Tokenizer, eos_id: int, context: int) -> Example | None:
    """Tokenize an example's text segments apart (a prompt is exactly what a reader of it shows the model), each trained
    one followed by the end-of-text token; an example longer than the context keeps its end. None when its last trained
    segment leaves no room for a token before it."""
    ids: list[int] = []
    trained: list[bool] = []
    last = 0
    for text, counts in segments:
        piece = tokenizer.encode(text).ids + ([eos_id] if counts else [])
        if counts:
            last = len(ids)
        ids += piece
        trained += [counts] * len(piece)
    if not any(trained) or len(ids) - last >= context + 1:
        return None  # an answer longer than the context teaches nothing the model could write
    keep = min(len(ids), context + 1)
    return Example(id=key, ids=tuple(ids[-keep:]), trained=tuple(trained[-keep:]))


def encode_examples(rows: list[dict], tokenizer: Tokenizer, eos_id: int, context: int) -> list[Example]:
    """Tokenize the task pairs; a prompt longer than the context keeps its end (as the benchmark cuts it)."""
    encoded = (
        encode_segments(row["id"], [(prompt(row["function"], row["call"]), False), (completion(row["expected"]), True)], tokenizer, eos_id, context)
        for row in rows
    )
    return fitting([e for e in encoded if e is not None], context)


def fitting(examples: list[Example], context: int) -> list[Example]:
    """The examples, refused when none fits the context."""
    if not examples:
        raise ConfigError(f"no example fits a context of {context} tokens: raise model.context")
    return examples


def order(count: int, seed: int, epoch: int) -> list[int]:
    """The seeded order of the examples in one epoch."""
    indices = list(range(count))
    random.Random(f"sft:{seed}:{epoch}").shuffle(indices)
    return indices


def collate(examples: list[Example], eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets padded to the longest example; targets are PAD inside prompts and after the end."""
    length = max(len(e.ids) for e in examples) - 1
    x = torch.full((len(examples), length), eos_id, dtype=torch.int64)
    y = torch.full((len(examples), length), PAD, dtype=torch.int64)
    for row, example in enumerate(examples):
        ids = torch.tensor(example.ids, dtype=torch.int64)
        n = len(ids) - 1
        x[row, :n] = ids[:-1]
        y[row, :n] = torch.where(torch.tensor(example.trained[1:]), ids[1:], PAD)
    return x, y


def sft_batches(
    examples: list[Example], batch_size: int, seed: int, eos_id: int, state: LoaderState | None = None, rank: int = 0, world: int = 1
) -> Iterator[Batch]:
    """Global batches of `batch_size` examples from the position `state.slot` (examples consumed) on; this rank's slice of each."""
    if batch_size % world:
        raise ConfigError(f"sft.batch_size ({batch_size}) must be divisible by the number of ranks ({world})")
    consumed = state.slot if state is not None else 0
    per_rank = batch_size // world
    orders: dict[int, list[int]] = {}
    while True:
        picked = []
        for position in range(consumed, consumed + batch_size):
            epoch, within = divmod(position, len(examples))
            if epoch not in orders:
                orders = {epoch: order(len(examples), seed, epoch)}
            picked.append(examples[orders[epoch][within]])
        consumed += batch_size
        mine = picked[rank * per_rank : (rank + 1) * per_rank]
        x, y = collate(mine, eos_id)
        completion_tokens = sum(sum(e.trained) for e in picked)
        yield Batch(
            x=x, y=y, documents=tuple((e.id,) for e in mine), state=LoaderState(slot=consumed), real_tokens=int((y != PAD).sum()),
            global_tokens=completion_tokens,
        )
