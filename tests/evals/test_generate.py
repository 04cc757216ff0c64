"""Generation: greedy follows the logits, sampling is seeded per row, inputs never exceed the context."""

import pytest
import torch
from torch import nn

from factory.evals.generate import greedy, sample

V = 10


class Successor(nn.Module):
    """Logits that favour (token + 1) mod V at every position, by `margin`; refuses inputs longer than `context`."""

    def __init__(self, context: int, margin: float = 5.0) -> None:
        super().__init__()
        self.context, self.margin = context, margin
        self.widths: list[int] = []

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.size(1) > self.context:
            raise ValueError("longer than the context")
        self.widths.append(idx.size(1))
        return self.margin * nn.functional.one_hot((idx + 1) % V, V).float()


class Uniform(nn.Module):
    """Every token equally likely."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*idx.shape, 50)


def test_greedy_follows_the_most_likely_token_from_each_row():
    prompts = torch.tensor([[3, 4], [7, 8], [0, 9]])
    new = greedy(Successor(context=16), prompts, new_tokens=5, context=16)
    assert new.tolist() == [[5, 6, 7, 8, 9], [9, 0, 1, 2, 3], [0, 1, 2, 3, 4]]


def test_inputs_keep_only_the_last_context_tokens():
    model = Successor(context=4)
    new = greedy(model, torch.tensor([[1, 2, 3]]), new_tokens=6, context=4)
    assert new.tolist() == [[4, 5, 6, 7, 8, 9]]
    assert model.widths == [3, 4, 4, 4, 4, 4]


def test_sampling_repeats_for_the_same_seeds_and_differs_for_others():
    prompts = torch.zeros(2, 3, dtype=torch.int64)
    a = sample(Uniform(), prompts, new_tokens=20, context=8, temperature=0.8, seeds=[1, 2])
    b = sample(Uniform(), prompts, new_tokens=20, context=8, temperature=0.8, seeds=[1, 2])
    c = sample(Uniform(), prompts, new_tokens=20, context=8, temperature=0.8, seeds=[3, 2])
    assert torch.equal(a, b)
    assert not torch.equal(a[0], a[1])
    assert not torch.equal(a[0], c[0])
    assert torch.equal(a[1], c[1])


def test_a_sampled_row_does_not_depend_on_its_batch():
    together = sample(Uniform(), torch.zeros(3, 2, dtype=torch.int64), 12, 8, 1.0, seeds=[5, 6, 7])
    alone = [sample(Uniform(), torch.zeros(1, 2, dtype=torch.int64), 12, 8, 1.0, seeds=[s]) for s in (5, 6, 7)]
    assert torch.equal(together, torch.cat(alone))


def test_sampling_at_low_temperature_follows_a_confident_model():
    new = sample(Successor(context=16, margin=50.0), torch.tensor([[2]]), new_tokens=4, context=16, temperature=0.8, seeds=[0])
    assert new.tolist() == [[3, 4, 5, 6]]


def test_sampling_needs_one_seed_per_row_and_a_positive_temperature():
    with pytest.raises(ValueError, match="one seed per row"):
        sample(Uniform(), torch.zeros(2, 2, dtype=torch.int64), 3, 8, 1.0, seeds=[1])
    with pytest.raises(ValueError, match="temperature"):
        sample(Uniform(), torch.zeros(1, 2, dtype=torch.int64), 3, 8, 0.0, seeds=[1])
