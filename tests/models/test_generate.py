"""The generator: cached greedy equals the uncached path, seeded sampling per row, stops, top-p, the context window."""

import pytest
import torch
from torch import nn

from factory.config.schema import ModelConfig
from factory.models.build import build_model
from factory.models.generate import TorchEngine, generate
from factory.models.sampling import Sampling, nucleus

VOCAB = 64
CONTEXT = 32
LENGTHS = (1, 3, 7, 12, 20, 31, 40)
"""Prompt lengths: some fit with their new tokens, some slide past the context, one is longer than it."""


def gpt(positions: str, seed: int = 0) -> nn.Module:
    """A small model: a GPT with `learned` or `rotary` positions, or a `llama` (grouped-query attention, untied)."""
    if positions == "llama":
        config = ModelConfig(arch="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, context=CONTEXT, positions="rotary",
                             tie_embeddings=False)
        return build_model(config, VOCAB, seed).eval()
    return build_model(ModelConfig(n_layer=2, n_head=4, n_embd=32, context=CONTEXT, positions=positions), VOCAB, seed).eval()


def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(1, VOCAB, (n,), generator=generator).tolist() for n in LENGTHS]


@torch.no_grad()
def reference_greedy(model: nn.Module, prompt: list[int], new_tokens: int) -> list[int]:
    """The factory's generator before the KV cache: the whole (cropped) sequence again for every token."""
    idx = torch.tensor([prompt])
    for _ in range(new_tokens):
        logits = model(idx[:, -CONTEXT:])[:, -1, :].float()
        idx = torch.cat([idx, logits.argmax(dim=-1).view(-1, 1)], dim=1)
    return idx[0, len(prompt) :].tolist()


@pytest.mark.parametrize("positions", ["learned", "rotary", "llama"])
def test_cached_greedy_is_the_uncached_path_batched_or_one_at_a_time(positions):
    model = gpt(positions)
    expected = [reference_greedy(model, p, 16) for p in prompts()]
    sampling = Sampling(new_tokens=16)
    batched = generate(model, prompts(), sampling, context=CONTEXT)
    alone = [generate(model, [p], sampling, context=CONTEXT)[0] for p in prompts()]
    uncached = generate(model, prompts(), sampling, context=CONTEXT, use_cache=False)
    assert [list(c.tokens) for c in batched] == expected
    assert [list(c.tokens) for c in alone] == expected
    assert [list(c.tokens) for c in uncached] == expected
    assert len({tuple(e) for e in expected}) > 1  # the prompts lead somewhere different
    for cached, plain in zip(batched, uncached, strict=True):
        assert max(abs(a - b) for a, b in zip(cached.logprobs, plain.logprobs, strict=True)) < 1e-4


@pytest.mark.parametrize("positions", ["learned", "llama"])
def test_the_static_decode_a_gpu_captures_as_a_graph_gives_the_same_tokens_on_the_cpu(positions):
    """The static cache (attended over whole, under a mask; the slot a tensor) is the path a CUDA graph replays; here it
    runs eagerly: the same greedy tokens as the uncached path, prompts of every length in one batch, past the context too."""
    model = gpt(positions, seed=1)
    expected = [reference_greedy(model, p, 16) for p in prompts()]
    short = generate(model, prompts()[:5], Sampling(new_tokens=16), context=CONTEXT, static=True)  # 12 steps, then it slides
    assert [list(c.tokens) for c in short] == expected[:5]
    pairs = generate(model, prompts(), Sampling(new_tokens=16), context=CONTEXT, static=True, batch_size=2)
    assert [list(c.tokens) for c in pairs] == expected
    with pytest.raises(ValueError, match="CUDA graphs need the model on a GPU"):
        generate(model, prompts(), Sampling(new_tokens=2), context=CONTEXT, graphs=True)


def test_left_padding_changes_nothing_in_small_batches_either():
    model = gpt("learned", seed=3)
    expected = [reference_greedy(model, p, 10) for p in prompts()]
    got = generate(model, prompts(), Sampling(new_tokens=10), context=CONTEXT, batch_size=2)
    assert [list(c.tokens) for c in got] == expected


class Successor(nn.Module):
    """A plugin-like model (no KV cache): logits favour (token + 1) mod 10 by `margin`; refuses inputs past its context."""

    def __init__(self, context: int, margin: float = 5.0) -> None:
        super().__init__()
        self.context, self.margin = context, margin
        self.widths: list[int] = []

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.size(1) > self.context:
            raise ValueError("longer than the context")
        self.widths.append(idx.size(1))
        return self.margin * nn.functional.one_hot((idx + 1) % 10, 10).float()


def test_a_model_without_a_cache_runs_uncached_on_the_last_context_tokens():
    model = Successor(context=4)
    engine = TorchEngine(model, 4)
    assert not engine.cached
    done = engine.generate([[1, 2, 3], [7], [5, 6, 7, 8, 9]], Sampling(new_tokens=6))
    assert [list(c.tokens) for c in done] == [[4, 5, 6, 7, 8, 9], [8, 9, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]]
    assert max(model.widths) == 4 and all(c.finish == "length" for c in done)


def test_sampling_repeats_for_the_same_seeds_and_a_row_does_not_depend_on_its_batch():
    model = gpt("rotary")
    sampling = Sampling(new_tokens=20, temperature=1.0)
    seeds = [11, 12, 13, 14, 15, 16, 17]
    a = generate(model, prompts(), sampling, context=CONTEXT, seeds=seeds)
    b = generate(model, prompts(), sampling, context=CONTEXT, seeds=seeds)
    alone = [generate(model, [p], sampling, context=CONTEXT, seeds=[s])[0] for p, s in zip(prompts(), seeds, strict=True)]
    other = generate(model, prompts()[:1], sampling, context=CONTEXT, seeds=[99])
    assert a == b
    assert [c.tokens for c in a] == [c.tokens for c in alone]
    assert other[0].tokens != a[0].tokens
    uncached = generate(model, prompts(), sampling, context=CONTEXT, seeds=seeds, use_cache=False)
    assert [c.tokens for c in uncached] == [c.tokens for c in a]  # the draws the factory made before the cache


def test_a_row_ends_at_end_of_text_or_a_stop_token_and_its_batch_mates_go_on():
    model = Successor(context=16)
    done = generate(model, [[2], [5], [8]], Sampling(new_tokens=5, eos_id=4, stop_ids=frozenset({9})), context=16)
    assert [list(c.tokens) for c in done] == [[3, 4], [6, 7, 8, 9], [9]]
    assert [c.finish for c in done] == ["eos", "stop", "stop"]
    assert done[0].text_tokens == (3,) and done[1].text_tokens == (6, 7, 8, 9)


@pytest.mark.parametrize("cached", [True, False])
def test_a_stop_string_ends_a_row_where_its_text_first_holds_it(cached):
    model = gpt("learned", seed=1)
    decode = lambda ids: "".join(chr(ord("a") + i % 26) for i in ids)  # noqa: E731
    free = generate(model, prompts(), Sampling(new_tokens=12), context=CONTEXT)
    varied = max(free, key=lambda c: len(set(c.tokens)))
    stop = decode(list(varied.tokens[4:6]))
    done = generate(model, prompts(), Sampling(new_tokens=12, stop_strings=(stop,)), context=CONTEXT, decode=decode, use_cache=cached)
    stopped = 0
    for whole, cut in zip(free, done, strict=True):
        first = next((k for k in range(1, 13) if stop in decode(list(whole.tokens[:k]))), None)
        assert cut.tokens == whole.tokens[:first]
        assert cut.finish == ("length" if first is None else "stop")
        stopped += first is not None
    assert 0 < stopped < len(LENGTHS)


def test_top_p_keeps_the_smallest_set_of_likely_tokens_that_reaches_p():
    probs = torch.tensor([[0.1, 0.5, 0.3, 0.1]])
    assert nucleus(probs, 0.5).tolist() == [[0.0, 0.5, 0.0, 0.0]]
    assert (nucleus(probs, 0.7) > 0).tolist() == [[False, True, True, False]]
    assert nucleus(probs, 1.0).tolist() == probs.tolist()
    model = gpt("learned")
    greedy = generate(model, prompts(), Sampling(new_tokens=10), context=CONTEXT)
    narrow = generate(model, prompts(), Sampling(new_tokens=10, temperature=1.0, top_p=1e-6), context=CONTEXT, seeds=range(7))
    wide = generate(model, prompts(), Sampling(new_tokens=10, temperature=1.0), context=CONTEXT, seeds=range(7))
    assert [c.tokens for c in narrow] == [c.tokens for c in greedy]
    assert [c.tokens for c in wide] != [c.tokens for c in greedy]


def test_calls_that_cannot_be_served_say_why():
    model = gpt("learned")
    with pytest.raises(ValueError, match="one seed per row"):
        generate(model, [[1], [2]], Sampling(new_tokens=3, temperature=1.0), context=CONTEXT, seeds=[1])
    with pytest.raises(ValueError, match="greedy decoding takes no seeds"):
        generate(model, [[1]], Sampling(new_tokens=3), context=CONTEXT, seeds=[1])
    with pytest.raises(ValueError, match="no tokens"):
        generate(model, [[]], Sampling(new_tokens=3), context=CONTEXT)
    with pytest.raises(ValueError, match="decode"):
        generate(model, [[1]], Sampling(new_tokens=3, stop_strings=("x",)), context=CONTEXT)
    with pytest.raises(ValueError, match="temperature"):
        Sampling(new_tokens=3, temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        Sampling(new_tokens=3, top_p=0.0)


class OutOfMemory(nn.Module):
    """A model whose forward runs out of GPU memory, as a batch too large for the card does."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_running_out_of_gpu_memory_says_which_setting_to_lower():
    from factory.errors import StageFailed

    with pytest.raises(StageFailed, match=r"out of GPU memory generating 3 prompt\(s\) in batches of 2 with 5 new tokens: lower the "
                                          r"batch size \(eval.batch_size for evaluations"):
        generate(OutOfMemory(), [[1], [2], [3]], Sampling(new_tokens=5), context=8, batch_size=2)
