"""The streaming loader against its consumer, its storage and its packing, measured side by side in one run.

On the real standard library (ingested into a temporary sqlite Iceberg catalog) and the settings
of tiny-code-lm:
1. Headroom: tokens/s the loader produces (`BlendLoader.batches`: read, shuffle, tokenize, pack)
   vs. tokens/s the trainer consumes (forward, loss, backward, clip and AdamW step of the tiny
   model on those same batches). Both count batch positions (batch_size x context). Goal: >= 10x.
2. Read overhead: text MB/s of reading the table through the loader (`PartReader`, split filter
   and block shuffle included) vs. reading the snapshot's Parquet files directly with pyarrow,
   both touching every text. Runs alternate and the best of each is kept. Goal: >= 0.8x.
3. Context fill of best-fit vs. next-fit packing of the same documents at the default context.

Text sizes are counted in characters (bytes, for source code that is almost all ASCII). `--smoke`: one package of the
standard library and a few batches, steps and reads, to check the bench runs.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import pyarrow.parquet as pq
import torch
from pyiceberg.catalog import Catalog
from tokenizers import Tokenizer
from torch.nn import functional as F

from factory.config import load
from factory.config.data_sections import SourceConfig
from factory.config.schema import Experiment
from factory.data.blend import Blend, BlendPart, count_splits
from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.ingest import read_documents
from factory.data.loader import PAD, Batch, BlendLoader, BlendStream, PartReader, fill_ratio
from factory.data.tables import TableVersion, write_version
from factory.models.build import build_model
from factory.models.tokenizer import EOS, sample_texts, train_tokenizer
from factory.train.pretrain import build_optimizer

LOG = logging.getLogger("bench.loader")
EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "tiny-code-lm.md"
READ_VALIDATION_PERCENT = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class Sizes:
    """How much each measure reads, trains and packs."""

    stdlib: tuple[str, ...] = ("**/*.py",)
    loader_batches: int = 200
    train_steps: int = 30
    warmup_steps: int = 3
    read_rounds: int = 5
    pack_docs: int = 2000
    tokenizer_sample_bytes: int | None = None
    """None: the experiment's."""


SMOKE = Sizes(stdlib=("json/**/*.py",), loader_batches=8, train_steps=4, warmup_steps=1, read_rounds=1, pack_docs=50,
              tokenizer_sample_bytes=100_000)


def build_table(catalog: Catalog, include: tuple[str, ...]) -> TableVersion:
    """The interpreter's standard library (its files matching `include`) as one table version."""
    with read_documents("stdlib", SourceConfig(kind="python-stdlib", include=include), LOG) as result:
        return write_version(catalog, "filtered.stdlib", result.documents, LOG)


def blend_of(catalog: Catalog, version: TableVersion, validation_percent: int) -> Blend:
    """A one-part blend, with the split counts `build_blend` records."""
    splits = count_splits(catalog, version.table, version.snapshot_id, validation_percent)  # as build_blend records them
    part = BlendPart(
        label="stdlib", table=version.table, tag=version.content_tag, version=version.tag, weight=1.0, mode="oversample", rows=version.rows,
        split_rows=splits,
    )
    return Blend(parts=(part,), validation_percent=validation_percent)


def make_loader(catalog: Catalog, blend: Blend, tokenizer: Tokenizer, experiment: Experiment, packing: str) -> BlendLoader:
    data = experiment.data
    stream = BlendStream(catalog=catalog, blend=blend, split="train", seed=experiment.seed, buffer_docs=data.shuffle_buffer_docs)
    return BlendLoader(
        stream=stream, tokenizer=tokenizer, eos_id=tokenizer.token_to_id(EOS), context=experiment.model.context, packing=packing,
        window_docs=data.pack_window_docs,
    )


def time_loader(loader: BlendLoader, batch_size: int, count: int) -> tuple[float, list[Batch]]:
    """Seconds to produce the first `count` batches from a fresh loader (opening the table included)."""
    started = time.perf_counter()
    batches = list(islice(loader.batches(batch_size), count))
    return time.perf_counter() - started, batches


def time_trainer(batches: list[Batch], experiment: Experiment, vocab_size: int, sizes: Sizes) -> float:
    """Seconds of the real training steps of the tiny model after its warm-up steps."""
    assert experiment.pretrain is not None, "tiny-code-lm has a pretrain section"
    model = build_model(experiment.model, vocab_size, experiment.seed)
    optimizer = build_optimizer(model, experiment.pretrain)
    model.train()
    started = 0.0
    for step, batch in enumerate(batches[: sizes.train_steps]):
        if step == sizes.warmup_steps:
            started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        logits = model(batch.x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), batch.y.view(-1), ignore_index=PAD)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), experiment.pretrain.grad_clip)
        optimizer.step()
        loss.item()
    return time.perf_counter() - started


def headroom(catalog: Catalog, blend: Blend, tokenizer: Tokenizer, experiment: Experiment, sizes: Sizes) -> None:
    assert experiment.pretrain is not None, "tiny-code-lm has a pretrain section"
    batch_size, context = experiment.pretrain.batch_size, experiment.model.context
    loader = make_loader(catalog, blend, tokenizer, experiment, experiment.data.packing)
    loading, batches = time_loader(loader, batch_size, sizes.loader_batches)
    training = time_trainer(batches, experiment, tokenizer.get_vocab_size(), sizes)
    timed_steps = sizes.train_steps - sizes.warmup_steps
    produced = sizes.loader_batches * batch_size * context / loading
    consumed = timed_steps * batch_size * context / training
    print(f"headroom: loader {produced:,.0f} tokens/s ({sizes.loader_batches} batches), trainer {consumed:,.0f} tokens/s "
          f"({timed_steps} steps; batch {batch_size} x context {context}, {experiment.data.packing})")
    print(f"headroom: loader / trainer = {produced / consumed:.1f}x (goal >= 10x)")


def read_through_loader(catalog: Catalog, blend: Blend, seed: int, buffer_docs: int) -> tuple[float, int]:
    """(seconds, characters) of one finite pass over the blend's only part, through a fresh `PartReader`."""
    started = time.perf_counter()
    reader = PartReader(catalog, blend.parts[0], 0, "train", blend.validation_percent, seed, buffer_docs)
    size = sum(len(document.text) for document in reader.documents_from(0, finite=True))
    return time.perf_counter() - started, size


def read_directly(files: list[str]) -> tuple[float, int]:
    """(seconds, characters) of reading the same Parquet files with pyarrow and touching every text."""
    started = time.perf_counter()
    table = pq.read_table(files, columns=["id", "path", "text"])
    size = sum(len(text) for text in table.column("text").to_pylist())
    return time.perf_counter() - started, size


def read_overhead(catalog: Catalog, version: TableVersion, seed: int, buffer_docs: int, rounds: int) -> None:
    blend = blend_of(catalog, version, READ_VALIDATION_PERCENT)
    tasks = catalog.load_table(version.table).scan(snapshot_id=version.snapshot_id).plan_files()
    files = [task.file.file_path.removeprefix("file://") for task in tasks]
    loader_runs, direct_runs = [], []
    for _ in range(rounds):
        loader_runs.append(read_through_loader(catalog, blend, seed, buffer_docs))
        direct_runs.append(read_directly(files))
    through = max(size / seconds for seconds, size in loader_runs) / 1e6
    direct = max(size / seconds for seconds, size in direct_runs) / 1e6
    print(f"read: through the loader {through:.0f} MB/s ({loader_runs[0][1] / 1e6:.1f} MB, the train split at "
          f"{READ_VALIDATION_PERCENT}% validation), pyarrow directly {direct:.0f} MB/s ({direct_runs[0][1] / 1e6:.1f} MB, {len(files)} file(s))")
    print(f"read: loader / direct = {through / direct:.2f}x (goal >= 0.8x; best of {rounds}, alternating)")


def packed_fill(loader: BlendLoader, docs: int) -> tuple[float, int, int]:
    """(fill, sequences, documents) of packing the first `docs` documents, rounded up to whole packing windows."""
    sequences = []
    for sequence in loader.sequences():
        sequences.append(sequence)
        if sequence.state.skip == 0 and sum(sequence.state.counts) >= docs:
            break
    return fill_ratio(sequences), len(sequences), sum(sequences[-1].state.counts)


def packing_fill(catalog: Catalog, blend: Blend, tokenizer: Tokenizer, experiment: Experiment, docs: int) -> None:
    fills = {packing: packed_fill(make_loader(catalog, blend, tokenizer, experiment, packing), docs)
             for packing in ("best-fit", "next-fit")}
    for packing, (fill, count, documents) in fills.items():
        print(f"packing: {packing} fills {100 * fill:.1f}% of positions in {count:,} sequences "
              f"(first {documents:,} train documents, context {experiment.model.context}, window {experiment.data.pack_window_docs})")
    print(f"packing: best-fit / next-fit fill = {fills['best-fit'][0] / fills['next-fit'][0]:.2f}x, "
          f"sequences = {fills['best-fit'][1] / fills['next-fit'][1]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a small table and a few batches: checks the bench runs")
    sizes = SMOKE if parser.parse_args().smoke else Sizes()
    experiment = load(EXPERIMENT)
    with tempfile.TemporaryDirectory() as tmp:
        catalog = open_catalog(CatalogConfig.local(tmp))
        version = build_table(catalog, sizes.stdlib)
        blend = blend_of(catalog, version, experiment.data.validation_percent)
        stream = BlendStream(catalog=catalog, blend=blend, split="train", seed=experiment.seed,
                             buffer_docs=experiment.data.shuffle_buffer_docs, finite=True)
        sample_bytes = sizes.tokenizer_sample_bytes or experiment.tokenizer.sample_bytes
        tokenizer = train_tokenizer(sample_texts(stream.texts(), sample_bytes), experiment.tokenizer)
        headroom(catalog, blend, tokenizer, experiment, sizes)
        read_overhead(catalog, version, experiment.seed, experiment.data.shuffle_buffer_docs, sizes.read_rounds)
        packing_fill(catalog, blend, tokenizer, experiment, sizes.pack_docs)


if __name__ == "__main__":
    main()
