"""GRPO arithmetic on small cases computed by hand."""

import math

import pytest
import torch

from factory.post.grpo import entropy, group_advantages, grpo_loss, token_logprobs


def test_advantages_are_normalised_within_each_group():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0], [1.1, 0.1, 0.1, 0.1]])
    advantages = group_advantages(rewards)
    # group 1: mean 0.5, population std 0.5
    assert advantages[0].tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    # a group whose completions all earn the same teaches nothing
    assert advantages[1].tolist() == [0.0, 0.0, 0.0, 0.0]
    # group 3: mean 0.35, std sqrt((0.75^2 + 3 * 0.25^2) / 4) = sqrt(0.1875)
    std = math.sqrt(0.1875)
    assert advantages[2].tolist() == pytest.approx([0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std], abs=1e-5)


def test_advantages_need_groups():
    with pytest.raises(ValueError, match="group of at least 2"):
        group_advantages(torch.tensor([1.0, 2.0]))


def one(value: float) -> torch.Tensor:
    return torch.tensor([[value]])


def test_on_policy_loss_is_minus_the_advantage():
    parts = grpo_loss(one(-1.0), one(-1.0), one(-1.0), torch.tensor([2.0]), one(1.0), clip=0.2, kl=0.1)
    assert parts.loss.item() == pytest.approx(-2.0)
    assert parts.ratio == pytest.approx(1.0) and parts.kl == pytest.approx(0.0) and parts.clipped == 0.0


def test_a_ratio_above_the_clip_range_is_clipped_for_a_positive_advantage():
    logp = torch.tensor([[math.log(1.5) - 1.0]], requires_grad=True)
    parts = grpo_loss(logp, one(-1.0), logp.detach(), torch.tensor([1.0]), one(1.0), clip=0.2, kl=0.0)
    assert parts.loss.item() == pytest.approx(-1.2)
    assert parts.clipped == 1.0 and parts.ratio == pytest.approx(1.5)
    parts.loss.backward()
    assert logp.grad.item() == 0.0  # outside the trust region nothing pushes further


def test_a_negative_advantage_keeps_the_unclipped_ratio_when_it_is_worse():
    logp = torch.tensor([[math.log(1.5)]], requires_grad=True)
    parts = grpo_loss(logp, one(0.0), logp.detach(), torch.tensor([-1.0]), one(1.0), clip=0.2, kl=0.0)
    assert parts.loss.item() == pytest.approx(1.5)  # -min(-1.5, -1.2)
    assert parts.clipped == 0.0
    parts.loss.backward()
    assert logp.grad.item() == pytest.approx(1.5)  # d/dlogp of ratio * 1 = ratio


def test_the_kl_penalty_is_the_k3_estimate():
    # ref - logp = ln 2: exp(ln 2) - ln 2 - 1 = 1 - ln 2
    parts = grpo_loss(one(0.0), one(0.0), one(math.log(2.0)), torch.tensor([0.0]), one(1.0), clip=0.2, kl=0.5)
    assert parts.kl == pytest.approx(1 - math.log(2.0))
    assert parts.loss.item() == pytest.approx(0.5 * (1 - math.log(2.0)))


def test_tokens_average_within_a_completion_then_over_completions():
    # row 1: one token with advantage 1 (loss -1); row 2: three tokens with advantage -2 (loss 2 each); the masked token is ignored.
    logp = torch.zeros(2, 4)
    mask = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    parts = grpo_loss(logp, logp, logp, torch.tensor([1.0, -2.0]), mask, clip=0.2, kl=0.0)
    assert parts.loss.item() == pytest.approx((-1.0 + 2.0) / 2)
    empty = grpo_loss(logp, logp, logp, torch.tensor([1.0, -2.0]), torch.tensor([[1.0, 0, 0, 0], [0.0, 0, 0, 0]]), clip=0.2, kl=0.0)
    assert empty.loss.item() == pytest.approx(-1.0)  # a row without tokens contributes nothing


def test_token_logprobs_and_entropy_follow_the_temperature():
    logits = torch.tensor([[[2.0, 0.0]]])
    assert token_logprobs(logits, torch.tensor([[0]])).item() == pytest.approx(math.log(math.exp(2) / (math.exp(2) + 1)))
    assert token_logprobs(logits, torch.tensor([[0]]), temperature=2.0).item() == pytest.approx(math.log(math.e / (math.e + 1)))
    uniform = torch.zeros(1, 1, 4)
    assert entropy(uniform).item() == pytest.approx(math.log(4))
