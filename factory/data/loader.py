"""The streaming loader: a blend -> documents -> packed token sequences -> batches, resumable exactly.

Every choice is a pure function of the blend, the seed and a small position, so a loader
started from a saved `LoaderState` yields exactly what an uninterrupted one would have:
- each part is read in its snapshot's order and shuffled in blocks of `buffer_docs` documents
  (block b of epoch e permuted by a generator seeded with (seed, part, e, b)), so the document
  at position p of a part is known without remembering a buffer;
- the part of slot t of the mixture is drawn from a generator seeded with (seed, t // CHUNK),
  so weights are followed without remembering a generator; a finite part that ran out leaves
  the mix (its slots are skipped);
- documents are packed window by window (`window_docs` documents at a time) and the window's
  sequences shuffled with a generator seeded by (seed, the window's first slot), so a position
  is (slot and per-part counts at the window's start, sequences already taken from the window).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, NamedTuple

import numpy as np
import torch
from pyiceberg.catalog import Catalog
from tokenizers import Tokenizer

from factory.config.schema import StreamSettings
from factory.data.blend import Blend, BlendPart, count_splits
from factory.data.documents import split_of
from factory.data.tables import record_batches, resolve
from factory.errors import ConfigError

CHUNK_SLOTS = 4096
PAD = -1
PACKINGS = ("best-fit", "next-fit")


@dataclass(frozen=True, kw_only=True, slots=True)
class LoaderState:
    """An exact position in the stream: where the current packing window starts, and how much of it was taken."""

    slot: int = 0
    counts: tuple[int, ...] = ()
    skip: int = 0

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form, as saved in checkpoints."""
        return {"slot": self.slot, "counts": list(self.counts), "skip": self.skip}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoaderState:
        """Inverse of `to_json`."""
        return cls(slot=int(data["slot"]), counts=tuple(int(c) for c in data["counts"]), skip=int(data["skip"]))


class Document(NamedTuple):
    """One document of the stream and the part it came from (a tuple: made once per row, so it must be cheap)."""

    part: int
    id: str
    path: str
    text: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Sequence:
    """`context + 1` tokens (PAD after the last real one), the documents in it, and the position after it."""

    tokens: np.ndarray
    documents: tuple[str, ...]
    state: LoaderState


@dataclass(frozen=True, kw_only=True, slots=True)
class Batch:
    """Inputs and next-token targets (-1 where there is nothing to predict) and the position after the batch."""

    x: torch.Tensor
    y: torch.Tensor
    documents: tuple[tuple[str, ...], ...]
    state: LoaderState
    real_tokens: int
    """Targets to predict in this rank's slice."""
    global_tokens: int
    """Targets to predict in the whole global batch (every rank's slice): the next-token loss is averaged over these."""
    loss_units: int = 0
    """What the summed loss of the global batch is averaged over, when not its targets (preference pairs, say); 0: they are."""

    @property
    def units(self) -> int:
        """What the loss of the global batch is averaged over: `loss_units`, else `global_tokens`."""
        return self.loss_units or self.global_tokens


class PartReader:
    """The documents of one blend part in one split, in block-shuffled order, from any position."""

    def __init__(self, catalog: Catalog, part: BlendPart, index: int, split: str, validation_percent: int, seed: int, buffer_docs: int):
        self.catalog, self.part, self.index = catalog, part, index
        self.split, self.validation_percent, self.seed, self.buffer_docs = split, validation_percent, seed, buffer_docs
        self.snapshot_id = resolve(catalog, part.table, part.tag)
        self.table = catalog.load_table(part.table)
        self._size: int | None = part.split_rows.get(split)

    @property
    def size(self) -> int:
        """Documents of this part in this split (as the blend recorded them, or counted once)."""
        if self._size is None:
            self._size = count_splits(self.catalog, self.part.table, self.snapshot_id, self.validation_percent)[self.split]
        return self._size

    def documents_from(self, position: int, finite: bool) -> Iterator[Document]:
        """Documents from `position` on; a finite reader stops after one epoch."""
        if self.size == 0:
            return
        epoch, offset = divmod(position, self.size)
        block, within = divmod(offset, self.buffer_docs)
        while True:
            rows = self._rows()
            for _ in islice(rows, block * self.buffer_docs):  # the blocks before the position
                pass
            while chunk := list(islice(rows, self.buffer_docs)):
                order = np.random.default_rng([self.seed, self.index, epoch, block]).permutation(len(chunk))
                for i in order[within:].tolist():
                    yield chunk[i]
                block, within = block + 1, 0
            if finite:
                return
            epoch, block = epoch + 1, 0

    def _rows(self) -> Iterator[Document]:
        for batch in record_batches(self.table, self.snapshot_id, ("id", "path", "text")):
            ids, paths, texts = (batch.column(name).to_pylist() for name in ("id", "path", "text"))
            for doc_id, path, text in zip(ids, paths, texts, strict=True):
                if split_of(doc_id, self.validation_percent) == self.split:
                    yield Document(part=self.index, id=doc_id, path=path, text=text)


@dataclass(kw_only=True)
class BlendStream:
    """Documents of a blend, interleaved by weight; each comes with the (slot, counts) after it."""

    catalog: Catalog
    blend: Blend
    split: str
    seed: int
    buffer_docs: int
    finite: bool = False
    """Read every part once (validation); otherwise each part follows its mode."""
    readers: list[PartReader] = field(init=False)

    def __post_init__(self) -> None:
        self.readers = [
            PartReader(self.catalog, part, i, self.split, self.blend.validation_percent, self.seed, self.buffer_docs)
            for i, part in enumerate(self.blend.parts)
        ]

    def documents(self, slot: int = 0, counts: tuple[int, ...] = ()) -> Iterator[tuple[Document, int, tuple[int, ...]]]:
        """Documents from a position on, with the position after each."""
        counts_now = list(counts) or [0] * len(self.readers)
        finite = [self.finite or part.mode == "finite" for part in self.blend.parts]
        live = [part.weight > 0 and reader.size > 0 and not (finite[i] and counts_now[i] >= reader.size)
                for i, (part, reader) in enumerate(zip(self.blend.parts, self.readers, strict=True))]
        streams: dict[int, Iterator[Document]] = {}
        choices, chunk = np.empty(0, dtype=np.int64), -1
        while any(live):
            if slot // CHUNK_SLOTS != chunk:
                chunk = slot // CHUNK_SLOTS
                rng = np.random.default_rng([self.seed, chunk])
                choices = rng.choice(len(self.readers), size=CHUNK_SLOTS, p=self.blend.weights)
            j = int(choices[slot % CHUNK_SLOTS])
            slot += 1
            if not live[j]:
                continue
            if j not in streams:
                streams[j] = self.readers[j].documents_from(counts_now[j], finite[j])
            document = next(streams[j])
            counts_now[j] += 1
            if finite[j] and counts_now[j] >= self.readers[j].size:
                live[j] = False
            yield document, slot, tuple(counts_now)

    def texts(self) -> Iterator[str]:
        """Just the texts, from the start."""
        return (document.text for document, _, _ in self.documents())


def pack(token_lists: list[list[int]], length: int, method: str) -> list[list[int]]:
    """Pack documents (already ending in EOS) into bins of at most `length` tokens; returns piece indices per bin.

    Documents longer than `length` are cut into `length`-token pieces first. `best-fit` places
    pieces longest first into the fullest bin that still has room; `next-fit` fills bins in
    arrival order and opens a new one when a piece does not fit.
    """
    if method not in PACKINGS:
        raise ConfigError(f"data.packing: unknown method {method!r}; choose one of {', '.join(PACKINGS)}")
    sizes = [len(piece) for piece in token_lists]
    bins: list[list[int]] = []
    if method == "next-fit":
        room = 0
        for i, size in enumerate(sizes):
            if size > room:
                bins.append([])
                room = length
            bins[-1].append(i)
            room -= size
        return bins
    free: list[tuple[int, int]] = []  # (room left, bin index), sorted
    for i in sorted(range(len(sizes)), key=lambda k: -sizes[k]):
        at = bisect.bisect_left(free, (sizes[i], -1))
        if at == len(free):
            bins.append([i])
            room, index = length - sizes[i], len(bins) - 1
        else:
            room, index = free.pop(at)
            bins[index].append(i)
            room -= sizes[i]
        if room > 0:
            bisect.insort(free, (room, index))
    return [sorted(b) for b in bins]


@dataclass(kw_only=True)
class BlendLoader:
    """Packed sequences and batches of a blend, resumable from any `LoaderState`."""

    stream: BlendStream
    tokenizer: Tokenizer
    eos_id: int
    context: int
    packing: str = "best-fit"
    window_docs: int = 64

    @property
    def length(self) -> int:
        """Tokens per sequence: the context plus one for the last target."""
        return self.context + 1

    def sequences(self, state: LoaderState | None = None) -> Iterator[Sequence]:
        """Packed sequences from a position on, each with the position after it."""
        state = state or LoaderState()
        start_slot, start_counts, skip = state.slot, state.counts, state.skip
        documents = self.stream.documents(start_slot, start_counts)
        while window := list(islice(documents, self.window_docs)):
            end_slot, end_counts = window[-1][1], window[-1][2]
            pieces, owners = self._pieces([document for document, _, _ in window])
            bins = pack(pieces, self.length, self.packing)
            # Bins come out grouped by piece length and document; a seeded shuffle keeps one batch from
            # being consecutive chunks of one file.
            order = np.random.default_rng([self.stream.seed, start_slot]).permutation(len(bins)).tolist()
            for k in range(skip, len(bins)):
                members = bins[order[k]]
                tokens = np.full(self.length, PAD, dtype=np.int64)
                filled = np.concatenate([pieces[i] for i in members])
                tokens[: len(filled)] = filled
                done = k == len(bins) - 1
                after = LoaderState(slot=end_slot, counts=end_counts) if done else LoaderState(slot=start_slot, counts=start_counts, skip=k + 1)
                yield Sequence(tokens=tokens, documents=tuple(dict.fromkeys(owners[i] for i in members)), state=after)
            start_slot, start_counts, skip = end_slot, end_counts, 0

    def _pieces(self, documents: list[Document]) -> tuple[list[list[int]], list[str]]:
        pieces, owners = [], []
        for document, encoding in zip(documents, self.tokenizer.encode_batch([d.text for d in documents]), strict=True):
            ids = encoding.ids + [self.eos_id]
            for start in range(0, len(ids), self.length):
                pieces.append(ids[start : start + self.length])
                owners.append(document.id)
        return pieces, owners

    def batches(self, batch_size: int, state: LoaderState | None = None, rank: int = 0, world: int = 1) -> Iterator[Batch]:
        """Global batches of `batch_size` sequences; this rank gets its slice, the same whatever the world size."""
        if batch_size % world:
            raise ConfigError(f"pretrain.batch_size ({batch_size}) must be divisible by the number of ranks ({world})")
        share = batch_size // world
        sequences = self.sequences(state)
        while len(group := list(islice(sequences, batch_size))) == batch_size:
            mine = group[rank * share : (rank + 1) * share]
            tokens = torch.from_numpy(np.stack([s.tokens for s in mine]))
            x, y = tokens[:, :-1].clone(), tokens[:, 1:].clone()
            x[x == PAD] = self.eos_id
            total = sum(int((s.tokens[1:] != PAD).sum()) for s in group)
            yield Batch(
                x=x, y=y, documents=tuple(s.documents for s in mine), state=group[-1].state, real_tokens=int((y != PAD).sum()), global_tokens=total
            )


def fill_ratio(sequences: list[Sequence]) -> float:
    """Share of sequence positions that hold real tokens (context fill)."""
    if not sequences:
        return 0.0
    return float(sum(int((s.tokens != PAD).sum()) for s in sequences) / sum(len(s.tokens) for s in sequences))


def build_loader(
    catalog: Catalog, blend: Blend, tokenizer: Tokenizer, eos_id: int, context: int, seed: int, stream: StreamSettings, split: str = "train"
) -> BlendLoader:
    """The loader of one split of a blend (training reads `train`), from the `stream` settings of a pretrain stage."""
    documents = BlendStream(
        catalog=catalog, blend=blend, split=split, seed=seed, buffer_docs=stream.shuffle_buffer_docs, finite=split != "train"
    )
    return BlendLoader(
        stream=documents, tokenizer=tokenizer, eos_id=eos_id, context=context, packing=stream.packing, window_docs=stream.pack_window_docs
    )
