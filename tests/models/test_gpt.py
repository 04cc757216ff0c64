"""The GPT model: shapes, seeded construction, weight tying, context limit and causality."""

import pytest
import torch

from factory.config.schema import ModelConfig
from factory.models.build import build_model

VOCAB = 50
CONFIG = ModelConfig(n_layer=1, n_head=2, n_embd=32, context=16)


def test_logits_have_one_row_per_position_and_vocab_entry():
    model = build_model(CONFIG, VOCAB, seed=0)
    idx = torch.randint(0, VOCAB, (3, 11))
    logits = model(idx)
    assert logits.shape == (3, 11, VOCAB)
    assert torch.isfinite(logits).all()


def test_same_seed_gives_identical_weights_and_another_seed_differs():
    a, b, c = build_model(CONFIG, VOCAB, seed=7), build_model(CONFIG, VOCAB, seed=7), build_model(CONFIG, VOCAB, seed=8)
    state_a, state_b, state_c = a.state_dict(), b.state_dict(), c.state_dict()
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert not torch.equal(state_a["wte.weight"], state_c["wte.weight"])
    assert not torch.equal(state_a["blocks.0.attn.qkv.weight"], state_c["blocks.0.attn.qkv.weight"])


def test_build_model_leaves_the_global_rng_state_alone():
    torch.manual_seed(123)
    expected = torch.rand(5)
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    build_model(CONFIG, VOCAB, seed=99)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(torch.rand(5), expected)


def test_tied_embeddings_share_storage():
    tied = build_model(CONFIG, VOCAB, seed=0)
    assert tied.lm_head.weight is tied.wte.weight
    assert tied.lm_head.weight.data_ptr() == tied.wte.weight.data_ptr()
    untied = build_model(CONFIG.model_copy(update={"tie_embeddings": False}), VOCAB, seed=0)
    assert untied.lm_head.weight.data_ptr() != untied.wte.weight.data_ptr()
    assert untied.num_parameters() == tied.num_parameters() + VOCAB * CONFIG.n_embd


def test_residual_projections_are_scaled_down_with_depth():
    deep = ModelConfig(n_layer=8, n_head=2, n_embd=32, context=16)
    model = build_model(deep, VOCAB, seed=0)
    proj = torch.cat([block.attn.proj.weight.flatten() for block in model.blocks])
    qkv = torch.cat([block.attn.qkv.weight.flatten() for block in model.blocks])
    assert proj.std().item() < 0.5 * qkv.std().item()


def test_input_longer_than_the_context_is_rejected():
    model = build_model(CONFIG, VOCAB, seed=0)
    model(torch.zeros(1, CONFIG.context, dtype=torch.int64))  # exactly the context is fine
    with pytest.raises(ValueError, match="longer than the model's context"):
        model(torch.zeros(1, CONFIG.context + 1, dtype=torch.int64))


def test_a_future_token_does_not_change_earlier_logits():
    model = build_model(CONFIG, VOCAB, seed=3).eval()
    idx = torch.randint(0, VOCAB, (2, CONFIG.context), generator=torch.Generator().manual_seed(0))
    changed = idx.clone()
    position = 9
    changed[:, position] = (idx[:, position] + 1) % VOCAB
    with torch.no_grad():
        before, after = model(idx), model(changed)
    torch.testing.assert_close(before[:, :position], after[:, :position], rtol=0, atol=1e-6)
    assert not torch.allclose(before[:, position:], after[:, position:])



def test_rotary_positions_replace_the_position_table_and_still_learn():
    from factory.config.schema import ModelConfig
    from factory.models.build import build_model
    from factory.models.gpt import rotate, rotary_tables

    config = ModelConfig(n_layer=1, n_head=2, n_embd=32, context=16, positions="rotary")
    model = build_model(config, 50, 0)
    assert "wpe.weight" not in model.state_dict() and not any("cos" in k for k in model.state_dict())
    cos, sin = rotary_tables(16, 16)
    x = torch.randn(1, 1, 16, 16)
    rotated = rotate(x, cos, sin)
    assert torch.allclose(rotated[..., 0, :], x[..., 0, :])  # position 0 is not rotated
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1), atol=1e-5)  # a rotation keeps lengths
    # Relative: the score of q at i and k at j depends on i - j only.
    q, k = torch.randn(16), torch.randn(16)
    at = lambda v, p: rotate(v.view(1, 1, 1, 16).expand(1, 1, 16, 16).contiguous(), cos, sin)[0, 0, p]
    assert torch.allclose(at(q, 5) @ at(k, 3), at(q, 9) @ at(k, 7), atol=1e-4)
    tokens = torch.randint(0, 50, (4, 16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
