"""The llama architecture: shapes, grouped-query attention, tied or untied head, causality, the context limit, and rotary
positions that make attention depend on relative offsets only."""

import pytest
import torch

from factory.config.schema import ModelConfig
from factory.models.build import build_model, count_parameters
from factory.models.llama import Llama, apply_rope, rope_tables

VOCAB = 50
CONFIG = ModelConfig(arch="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, context=16)


def test_logits_have_one_row_per_position_and_no_bias_anywhere():
    model = build_model(CONFIG, VOCAB, seed=0)
    assert isinstance(model, Llama)
    logits = model(torch.randint(0, VOCAB, (3, 11)))
    assert logits.shape == (3, 11, VOCAB) and torch.isfinite(logits).all()
    assert not [name for name in model.state_dict() if name.endswith("bias")]
    assert "cos" not in model.state_dict() and "sin" not in model.state_dict()  # derived from the config


def test_key_value_heads_are_shared_between_query_heads():
    attention = build_model(CONFIG, VOCAB, seed=0).layers[0].self_attn
    assert attention.q_proj.weight.shape == (32, 32) and attention.k_proj.weight.shape == (16, 32) == attention.v_proj.weight.shape
    full = build_model(CONFIG.model_copy(update={"n_kv_head": None}), VOCAB, seed=0).layers[0].self_attn
    assert full.k_proj.weight.shape == (32, 32)


def test_grouped_attention_equals_attention_with_each_kv_head_repeated_for_its_queries():
    grouped = build_model(CONFIG, VOCAB, seed=1).eval()
    full = build_model(CONFIG.model_copy(update={"n_kv_head": None}), VOCAB, seed=1).eval()
    state = grouped.state_dict()
    for name in list(state):
        if name.endswith(("k_proj.weight", "v_proj.weight")):  # kv head j serves query heads 2j and 2j + 1
            state[name] = state[name].view(2, 1, 8, 32).expand(2, 2, 8, 32).reshape(32, 32)
    full.load_state_dict(state)
    idx = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(grouped(idx), full(idx), rtol=0, atol=1e-5)


def test_tied_head_is_the_embedding_and_untied_adds_its_parameters():
    tied = build_model(CONFIG, VOCAB, seed=0)
    untied = build_model(CONFIG.model_copy(update={"tie_embeddings": False}), VOCAB, seed=0)
    assert tied.lm_head.weight is tied.embed_tokens.weight
    assert count_parameters(untied) == count_parameters(tied) + VOCAB * 32


def test_a_future_token_does_not_change_earlier_logits_and_the_context_is_a_limit():
    model = build_model(CONFIG, VOCAB, seed=3).eval()
    idx = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    changed = idx.clone()
    changed[:, 9] = (idx[:, 9] + 1) % VOCAB
    with torch.no_grad():
        before, after = model(idx), model(changed)
    torch.testing.assert_close(before[:, :9], after[:, :9], rtol=0, atol=1e-6)
    assert not torch.allclose(before[:, 9:], after[:, 9:])
    with pytest.raises(ValueError, match="longer than the model's context"):
        model(torch.zeros(1, 17, dtype=torch.int64))


def test_rotary_scores_depend_on_the_offset_between_positions_and_on_theta():
    cos, sin = rope_tables(32, 8, theta=10_000.0)
    q, k = torch.randn(8, generator=torch.Generator().manual_seed(0)), torch.randn(8, generator=torch.Generator().manual_seed(1))

    def score(i: int, j: int, tables=(cos, sin)) -> float:
        c, s = tables
        return float(apply_rope(q, c[i], s[i]) @ apply_rope(k, c[j], s[j]))

    assert score(5, 2) == pytest.approx(score(20, 17), abs=1e-5) and score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)
    assert score(5, 2, rope_tables(32, 8, theta=50.0)) != pytest.approx(score(5, 2), abs=1e-3)


def test_a_llama_learns_a_repeating_sequence():
    config = ModelConfig(arch="llama", n_layer=1, n_head=2, n_embd=32, context=16)
    model = build_model(config, VOCAB, seed=0)
    data = torch.arange(17).remainder(5).view(1, -1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        loss = torch.nn.functional.cross_entropy(model(data[:, :-1]).flatten(0, 1), data[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]
