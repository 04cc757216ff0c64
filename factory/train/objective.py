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
from typing import Any

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


CHUNK_ELEMENTS = 1 << 24
"""Logits the loss widens to float32 at a time (64 MB): the rows of one chunk."""


class _SummedCrossEntropy(torch.autograd.Function):
    """Cross-entropy summed over the rows whose target is not PAD, computed a chunk of rows at a time in float32 (float64 for
    float64 logits) from logits of any precision: neither pass holds a float32 copy of the whole logits tensor (bf16 logits
    of a 32k vocabulary at batch 16 x 2048 would be 4.3 GB more). It keeps the logits it was given and each row's
    log-sum-exp for the backward. On a GPU each chunk's passes are compiled into fused kernels that read the logits once
    and write the gradient once, in the logits' precision (eager, the widening, max, exp and sums each go through memory)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        rows, forward = max(1, CHUNK_ELEMENTS // logits.size(-1)), _kernel(_chunk_forward, logits)
        parts = [forward(logits[start : start + rows], targets[start : start + rows]) for start in range(0, logits.size(0), rows)]
        lse = torch.cat([part[0] for part in parts])
        ctx.save_for_backward(logits, targets, lse)
        return torch.stack([part[1] for part in parts]).sum()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, targets, lse = ctx.saved_tensors
        rows, backward = max(1, CHUNK_ELEMENTS // logits.size(-1)), _kernel(_chunk_backward, logits)
        out = torch.empty_like(logits)
        for start in range(0, logits.size(0), rows):
            end = start + rows
            out[start:end] = backward(logits[start:end], targets[start:end], lse[start:end], grad)
        return out, None


def _chunk_forward(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's log-sum-exp, and the chunk's summed loss, in at least float32."""
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
    lse = torch.logsumexp(wide, dim=-1)
    picked = wide.gather(1, targets.clamp(min=0).unsqueeze(1)).squeeze(1)
    return lse, ((lse - picked) * (targets != PAD)).sum()


def _chunk_backward(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """d loss / d logits of a chunk, in the logits' precision: (softmax - one-hot) times the upstream gradient, on the rows
    that count."""
    probs = torch.exp(logits.to(lse.dtype) - lse.unsqueeze(1))
    target = torch.arange(logits.size(1), device=logits.device).unsqueeze(0) == targets.unsqueeze(1)
    weight = (targets != PAD).to(lse.dtype) * grad
    return ((probs - target.to(lse.dtype)) * weight.unsqueeze(1)).to(logits.dtype)


_compiled: dict[Callable, Callable] = {}


def _kernel(function: Callable, logits: torch.Tensor) -> Callable:
    """`function` compiled (once per process) when the logits are on a GPU; as it is elsewhere."""
    if logits.device.type != "cuda":
        return function
    if function not in _compiled:
        _compiled[function] = torch.compile(function, fullgraph=True)  # a second shape (a last chunk) compiles a dynamic one
    return _compiled[function]


def summed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The cross-entropy of `logits` (..., vocab) against `targets` (...), summed over the targets that are not PAD, in at
    least float32. Eager, logits of a lower precision (bf16 under autocast) go a chunk of rows at a time
    (`_SummedCrossEntropy`), never widened whole; float32 logits need no wider copy and take torch's own kernel, as they
    always did. Inside a compiled step (`compile: true`) the logits are widened and given to torch's kernel, and the
    compiler fuses the widening into the loss's kernels; the chunks' loops would only cut its graph into pieces (on an
    H100 the 0.9B Llama of bench/gpu.py stepped 8% faster so, at the same peak memory as with the chunks)."""
    flat, flat_targets = logits.reshape(-1, logits.size(-1)), targets.reshape(-1)
    if flat.dtype in (torch.float32, torch.float64) or torch.compiler.is_compiling():
        wide = flat.to(torch.promote_types(flat.dtype, torch.float32))
        return F.cross_entropy(wide, flat_targets, ignore_index=PAD, reduction="sum")
    return _SummedCrossEntropy.apply(flat, flat_targets)


def next_token_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, frozen: Mapping[str, nn.Module]) -> torch.Tensor:
    """The next-token cross-entropy summed over the targets that are not PAD."""
    return summed_cross_entropy(model(x), y)


NEXT_TOKEN = Objective(name="next-token", loss=next_token_loss)
"""Pretraining's and SFT's objective."""


class Minimised(nn.Module):
    """A model and the loss it minimises as one module: what the step loop calls, compiled and under DDP, so that the loss
    is compiled together with the model (the cross-entropy fused into the graph instead of run beside it; on the CPU the
    bench model steps 1.4x faster so). Its parameters are the model's alone: the frozen models sit in a plain dict."""

    def __init__(self, model: nn.Module, objective: Objective, frozen: Mapping[str, nn.Module]) -> None:
        super().__init__()
        self.model = model
        self.objective = objective
        self.frozen = dict(frozen)

    def forward(self, x: torch.Tensor, y: torch.Tensor, per_token: bool = False) -> torch.Tensor:
        """The objective's summed loss of a micro-batch; with `per_token`, the next-token loss of every target instead
        (batch, time; 0 at PAD), which control rules that look at sequences read."""
        if per_token:
            logits = self.model(x)
            return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.view(-1), ignore_index=PAD, reduction="none").view(y.shape)
        return self.objective.loss(self.model, x, y, self.frozen)


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
