"""GRPO's arithmetic: group-normalised advantages, token log-probabilities, and the clipped objective with a KL penalty.

For a group of G completions of one prompt with rewards r, each completion's advantage is
(r - mean(r)) / (std(r) + eps) (population std): a group whose completions all earn the same
teaches nothing. The objective per completion token is PPO's clipped surrogate

    min(ratio * A, clip(ratio, 1 - clip, 1 + clip) * A),   ratio = exp(logp - logp_old)

minus `kl` times the k3 estimate of KL(policy || reference), exp(ref - logp) - (ref - logp) - 1,
which is never negative. The loss averages over each completion's tokens, then over completions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

EPS = 1e-6


def group_advantages(rewards: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """(prompts, G) rewards -> (prompts, G) advantages, normalised within each row (group)."""
    if rewards.dim() != 2 or rewards.size(1) < 2:
        raise ValueError(f"rewards must be (prompts, group) with a group of at least 2, got shape {tuple(rewards.shape)}")
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, unbiased=False, keepdim=True)
    return (rewards - mean) / (std + eps)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each target token under `logits / temperature`: (B, T, V), (B, T) -> (B, T)."""
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of each position's distribution under `logits / temperature`: (B, T, V) -> (B, T)."""
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


@dataclass(frozen=True, kw_only=True, slots=True)
class LossParts:
    """The loss and what it is made of (the statistics are detached means over completion tokens)."""

    loss: torch.Tensor
    kl: float
    clipped: float
    """Share of completion tokens whose ratio was clipped (the clipped term was the smaller)."""
    ratio: float


def grpo_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
    clip: float, kl: float,
) -> LossParts:
    """The GRPO loss over completions: (B, T) log-probs under the policy, the sampling policy and the reference;
    (B,) advantages; (B, T) mask of completion tokens. Rows without a token contribute nothing."""
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    a = advantages.unsqueeze(1)
    unclipped, clipped = ratio * a, torch.clamp(ratio, 1 - clip, 1 + clip) * a
    surrogate = torch.minimum(unclipped, clipped)
    delta = ref_logp - logp
    penalty = torch.exp(delta) - delta - 1
    per_token = -(surrogate - kl * penalty)
    tokens = mask.sum(dim=1)
    per_row = (per_token * mask).sum(dim=1) / tokens.clamp(min=1)
    loss = per_row.sum() / max(1, int((tokens > 0).sum()))
    total = mask.sum().clamp(min=1)
    with torch.no_grad():
        return LossParts(
            loss=loss,
            kl=float((penalty * mask).sum() / total),
            clipped=float(((clipped < unclipped).to(mask.dtype) * mask).sum() / total),
            ratio=float((ratio * mask).sum() / total),
        )
