"""What a training stage minimises: a loss over one micro-batch, and the frozen models it compares against.

The loop (`factory.train.pretrain.pretrain`) is the same for every training kind: placement on ranks and GPUs,
DDP/FSDP, precision and compile, control rules, the tracker, checkpoints and bitwise resume. What differs is the
objective: `loss(model, x, y, frozen)` returns the *summed* loss of one micro-batch (rows of `x` and `y`, on the
model's device), and the loop divides it by the global batch's `Batch.loss_units`, so every rank count and
accumulation split computes the same mean. Pretraining and fine-tuning sum the next-token cross-entropy over the
targets that are not PAD (`NEXT_TOKEN`); a plugin's objective (DPO's, say) sums whatever its batches hold, and asks for
frozen models by name: `reference` is a copy of the weights the stage starts from, in eval mode, never trained.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from factory.data.loader import PAD
from factory.errors import ConfigError

Loss = Callable[[nn.Module, torch.Tensor, torch.Tensor, Mapping[str, nn.Module]], torch.Tensor]
REFERENCE = "reference"
"""The frozen copy of the starting weights (DPO's and RL's reference policy)."""
FROZEN = (REFERENCE,)
"""The frozen models an objective may ask for."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Objective:
    """The loss a training stage minimises, and the frozen models it reads."""

    name: str
    loss: Loss
    """`loss(model, x, y, frozen)`: the summed loss of one micro-batch (`frozen`: the models of `frozen`, by name)."""
    frozen: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if unknown := [name for name in self.frozen if name not in FROZEN]:
            raise ConfigError(f"objective {self.name!r} asks for frozen models {unknown}; known: {', '.join(FROZEN)}")


def next_token_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, frozen: Mapping[str, nn.Module]) -> torch.Tensor:
    """The next-token cross-entropy summed over the targets that are not PAD."""
    logits = model(x)
    return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.view(-1), ignore_index=PAD, reduction="sum")


NEXT_TOKEN = Objective(name="next-token", loss=next_token_loss)
"""Pretraining's and SFT's objective."""


def sequence_log_probs(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The summed log-probability of each row's targets that are not PAD, one value per row: what preference objectives
    compare (x and y are (rows, time))."""
    logits = model(x).float()
    picked = torch.gather(F.log_softmax(logits, dim=-1), -1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * (y != PAD)).sum(dim=-1)


def frozen_models(objective: Objective, build: Callable[[], nn.Module], weights: Mapping[str, torch.Tensor] | None,
                  device: torch.device) -> dict[str, nn.Module]:
    """The frozen models `objective` asks for: `reference` is `build()` loaded with the starting `weights` (its seeded
    initialisation when the stage starts from none), on `device`, in eval mode, without gradients."""
    frozen: dict[str, nn.Module] = {}
    if REFERENCE in objective.frozen:
        model = build()
        if weights is not None:
            model.load_state_dict(dict(weights))
        frozen[REFERENCE] = model.to(device).eval().requires_grad_(False)
    return frozen
