"""The streaming loader over a real Iceberg blend: exact resume, weights, modes, ranks, packing."""

from collections import Counter
from itertools import islice

import numpy as np
import pytest
import torch

from factory.config.schema import TokenizerConfig
from factory.data.blend import Blend, BlendPart
from factory.data.loader import PAD, BlendLoader, BlendStream, LoaderState, fill_ratio, pack
from factory.data.tables import write_version
from factory.models.tokenizer import EOS, train_tokenizer
from tests.data.conftest import LOG, documents

CONTEXT = 32


def code(i: int, lines: int) -> str:
    return "".join(f"def f_{i}_{k}(x):\n    return x * {k} + {i}\n" for k in range(lines))


@pytest.fixture
def tables(catalog):
    """Two real tables of different sizes: `a` has 120 documents, `b` has 40."""
    a = write_version(catalog, "filtered.a", documents("a", {f"a/{i}.py": code(i, 1 + i % 7) for i in range(120)}), LOG)
    b = write_version(catalog, "filtered.b", documents("b", {f"b/{i}.py": "# " + "word " * (5 + i) for i in range(40)}), LOG)
    return a, b


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([code(i, 5) for i in range(50)], TokenizerConfig(vocab_size=300, min_frequency=2))


def make_blend(tables, weights=(3.0, 1.0), modes=("oversample", "oversample")) -> Blend:
    parts = tuple(
        BlendPart(label=v.table, table=v.table, tag=v.content_tag, version=v.tag, weight=w, mode=m, rows=v.rows)
        for v, w, m in zip(tables, weights, modes, strict=True)
    )
    return Blend(parts=parts, validation_percent=10)


def make_loader(catalog, blend, tokenizer, packing="best-fit", split="train", finite=False, seed=7) -> BlendLoader:
    stream = BlendStream(catalog=catalog, blend=blend, split=split, seed=seed, buffer_docs=16, finite=finite)
    return BlendLoader(stream=stream, tokenizer=tokenizer, eos_id=tokenizer.token_to_id(EOS), context=CONTEXT, packing=packing, window_docs=8)


def same_batches(left, right) -> bool:
    return all(torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and a.documents == b.documents for a, b in zip(left, right, strict=True))


def test_a_resumed_loader_yields_exactly_the_uninterrupted_batches(catalog, tables, tokenizer):
    blend = make_blend(tables)
    whole = list(islice(make_loader(catalog, blend, tokenizer).batches(4), 60))
    assert len(whole) == 60
    for stop in (1, 7, 23, 41):  # mid-window and across epochs of the small part
        saved = LoaderState.from_json(whole[stop - 1].state.to_json())
        resumed = list(islice(make_loader(catalog, blend, tokenizer).batches(4, state=saved), 60 - stop))
        assert same_batches(resumed, whole[stop:])
    assert any(batch.state.skip > 0 for batch in whole), "some positions must fall inside a packing window"


def test_the_seed_changes_the_order(catalog, tables, tokenizer):
    blend = make_blend(tables)
    one = list(islice(make_loader(catalog, blend, tokenizer, seed=1).batches(4), 5))
    two = list(islice(make_loader(catalog, blend, tokenizer, seed=2).batches(4), 5))
    assert not same_batches(one, two)


def test_weights_decide_the_mix_without_rewriting_data(catalog, tables):
    for weights in ((3.0, 1.0), (1.0, 3.0)):
        stream = BlendStream(catalog=catalog, blend=make_blend(tables, weights), split="train", seed=3, buffer_docs=16)
        parts = Counter(document.part for document, _, _ in islice(stream.documents(), 2000))
        share = parts[0] / 2000
        assert abs(share - weights[0] / 4) < 0.05
    assert [len(list(catalog.load_table(t).snapshots())) for t in ("filtered.a", "filtered.b")] == [1, 1]


def test_finite_parts_give_each_document_once_then_leave_the_mix(catalog, tables):
    blend = make_blend(tables, modes=("oversample", "finite"))
    stream = BlendStream(catalog=catalog, blend=blend, split="train", seed=3, buffer_docs=16)
    ids = [document.id for document, _, _ in islice(stream.documents(), 1000) if document.part == 1]
    assert len(ids) == len(set(ids)) == stream.readers[1].size
    everything = BlendStream(catalog=catalog, blend=blend, split="train", seed=3, buffer_docs=16, finite=True)
    all_ids = [document.id for document, _, _ in everything.documents()]
    assert len(all_ids) == len(set(all_ids)) == stream.readers[0].size + stream.readers[1].size


def test_oversampled_parts_repeat_in_a_new_order(catalog, tables):
    stream = BlendStream(catalog=catalog, blend=make_blend(tables, (0.0, 1.0)), split="train", seed=3, buffer_docs=16)
    size = stream.readers[1].size
    ids = [document.id for document, _, _ in islice(stream.documents(), 2 * size)]
    first, second = ids[:size], ids[size:]
    assert sorted(first) == sorted(second) and first != second


def test_train_and_validation_are_disjoint(catalog, tables):
    blend = make_blend(tables)
    train = {d.id for d, _, _ in BlendStream(catalog=catalog, blend=blend, split="train", seed=0, buffer_docs=16, finite=True).documents()}
    valid = {d.id for d, _, _ in BlendStream(catalog=catalog, blend=blend, split="validation", seed=0, buffer_docs=16, finite=True).documents()}
    assert valid and train and not train & valid
    assert len(train) + len(valid) == 160


def test_every_rank_gets_a_disjoint_slice_of_the_same_global_batch(catalog, tables, tokenizer):
    blend = make_blend(tables)
    single = list(islice(make_loader(catalog, blend, tokenizer).batches(4), 6))
    ranks = [list(islice(make_loader(catalog, blend, tokenizer).batches(4, rank=r, world=2), 6)) for r in range(2)]
    for step, whole in enumerate(single):
        assert torch.equal(torch.cat([ranks[0][step].x, ranks[1][step].x]), whole.x)
        assert ranks[0][step].documents + ranks[1][step].documents == whole.documents


def test_packing_keeps_every_token_and_best_fit_fills_better(catalog, tables, tokenizer):
    blend = make_blend(tables, modes=("finite", "finite"))
    fills = {}
    for method in ("best-fit", "next-fit"):
        loader = make_loader(catalog, blend, tokenizer, packing=method, finite=True)
        sequences = list(loader.sequences())
        tokens = sum(int((s.tokens != PAD).sum()) for s in sequences)
        texts = [d.text for d, _, _ in loader.stream.documents()]
        assert tokens == sum(len(e.ids) + 1 for e in tokenizer.encode_batch(texts))
        fills[method] = fill_ratio(sequences)
    assert fills["best-fit"] > fills["next-fit"]


def test_best_fit_puts_pieces_in_the_fullest_bin_with_room():
    bins = pack([[1] * 6, [1] * 5, [1] * 4, [1] * 3, [1] * 2], length=8, method="best-fit")
    assert bins == [[0, 4], [1, 3], [2]]  # 6+2, 5+3, 4: each piece went to the fullest bin that had room
    assert pack([[1] * 6, [1] * 5, [1] * 2], length=8, method="next-fit") == [[0], [1, 2]]


def test_targets_ignore_padding(catalog, tables, tokenizer):
    batch = next(make_loader(catalog, make_blend(tables), tokenizer).batches(8))
    assert batch.x.shape == batch.y.shape == (8, CONTEXT)
    assert (batch.x >= 0).all()
    assert batch.real_tokens == int((batch.y != PAD).sum()) > 0
    assert np.array_equal(batch.x[:, 1:].numpy()[batch.y[:, :-1].numpy() != PAD], batch.y[:, :-1].numpy()[batch.y[:, :-1].numpy() != PAD])
