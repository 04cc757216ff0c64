"""The KV cache: positions and masks under left padding, its capacity, and a model whose state dict it leaves alone."""

import pytest
import torch

from factory.config.schema import ModelConfig
from factory.models.build import build_model
from factory.models.generate import generate
from factory.models.kv_cache import KVCache, supports_kv_cache
from factory.models.sampling import Sampling

VOCAB = 40


def test_positions_count_real_tokens_only_and_go_on_across_chunks():
    cache = KVCache(batch=2, capacity=6)
    cache.feed(torch.tensor([[False, False, True, True], [True, True, True, True]]))
    assert cache.positions.tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]
    cache.feed(torch.tensor([[True], [True]]))
    assert cache.positions.tolist() == [[2], [4]]
    assert (cache.start, cache.end) == (4, 5)


def test_the_mask_hides_padding_and_the_future_but_a_padding_slot_sees_itself():
    cache = KVCache(batch=1, capacity=4)
    cache.feed(torch.tensor([[False, True, True]]))
    assert cache.mask.shape == (1, 1, 3, 3)
    assert cache.mask[0, 0].tolist() == [[True, False, False], [False, True, False], [False, True, True]]
    cache.feed(torch.tensor([[True]]))
    assert cache.mask[0, 0].tolist() == [[False, True, True, True]]


def test_a_layer_returns_everything_stored_so_far_and_the_cache_refuses_more_than_its_capacity():
    cache = KVCache(batch=1, capacity=3)
    cache.feed(torch.ones(1, 2, dtype=torch.bool))
    keys, values = cache.layer(0).update(torch.ones(1, 2, 2, 4), 2 * torch.ones(1, 2, 2, 4))
    assert keys.shape == (1, 2, 2, 4)
    cache.feed(torch.ones(1, 1, dtype=torch.bool))
    keys, values = cache.layer(0).update(3 * torch.ones(1, 2, 1, 4), 4 * torch.ones(1, 2, 1, 4))
    assert keys[0, 0, :, 0].tolist() == [1, 1, 3] and values[0, 0, :, 0].tolist() == [2, 2, 4]
    with pytest.raises(ValueError, match="was fed 1"):
        cache.layer(1).update(torch.ones(1, 2, 2, 4), torch.ones(1, 2, 2, 4))
    with pytest.raises(ValueError, match="holds 3 positions"):
        cache.feed(torch.ones(1, 1, dtype=torch.bool))


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_generating_adds_nothing_to_the_state_dict(positions):
    model = build_model(ModelConfig(n_layer=1, n_head=2, n_embd=16, context=16, positions=positions), VOCAB, seed=0)
    assert supports_kv_cache(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    generate(model, [[1, 2, 3], [4]], Sampling(new_tokens=20), context=16)
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)


def test_the_gpt_refuses_a_cache_past_its_context():
    model = build_model(ModelConfig(n_layer=1, n_head=2, n_embd=16, context=8), VOCAB, seed=0).eval()
    cache = KVCache(batch=1, capacity=9)
    cache.feed(torch.ones(1, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="past the model's context"):
        model(torch.zeros(1, 9, dtype=torch.int64), cache)
