"""The one device rule: where a stage computes, and how fast that device could go.

A stage uses the GPUs its placement gives it and the CPU otherwise:

- `gpus` > 0 (an experiment's `resources.gpus`; Volcano gives the pod `nvidia.com/gpu` of the same number): rank r of a
  node computes on `cuda:r`. A local run that asks for GPUs on a machine without any is warned once and runs on the CPU
  (`factory check --cluster` refuses such a placement on a cluster before anything runs).
- `gpus` == 0: the CPU, even on a machine with GPUs.
- `gpus` None: whatever this machine has: its first GPU when it has one. Evaluation batches (their pod is given the
  cluster profile's `evaluations.gpus`, or none) and Podium's Generate are placed so.

The peak table gives model FLOPs utilisation (MFU) a denominator: dense bf16 tensor-core FLOP/s of known GPUs. An
unknown GPU has no peak (`peak_flops` returns None) and its rows say so instead of guessing.

torch is imported by the functions that use it: `factory plan` describes a placement without loading it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    # (a part of the name torch.cuda.get_device_name reports, dense bf16 TFLOP/s); the first that matches wins
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM
    ("GH200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
)

_warned: set[int] = set()


def device_for(gpus: int | None, local_rank: int = 0, log: logging.Logger | None = None) -> torch.device:
    """The device rank `local_rank` of a node computes on, given the GPUs its placement gives the node (see the module)."""
    import torch

    spread = gpus_used(gpus)
    if spread == 0:
        if gpus and gpus not in _warned:
            _warned.add(gpus)
            (log or logging.getLogger("factory")).warning(
                "resources.gpus asks for %d GPU(s), but this machine has none: the stage runs on the CPU", gpus)
        return torch.device("cpu")
    return torch.device("cuda", local_rank % spread)


def gpus_used(gpus: int | None) -> int:
    """How many of this machine's GPUs the ranks of a node spread over, given the placement's `gpus` (0: the CPU)."""
    import torch

    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return available if gpus is None else min(gpus, available)


def where(gpus: int | None) -> str:
    """How `factory plan` and stage summaries name a placement's device: `cpu`, `cuda x2`, or `auto` (this machine's)."""
    if gpus is None:
        return "auto"
    return f"cuda x{gpus}" if gpus else "cpu"


def describe(device: torch.device) -> str:
    """The device a stage ran on, for its summary: `cpu`, or `cuda (NVIDIA H100 80GB HBM3)`."""
    import torch

    if device.type != "cuda":
        return device.type
    return f"cuda ({torch.cuda.get_device_name(device)})"


def peak_flops(device: torch.device) -> float | None:
    """The dense bf16 FLOP/s of `device`'s GPU from the table above; None on the CPU and on a GPU the table does not know."""
    import torch

    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((tflops * 1e12 for part, tflops in PEAK_BF16_TFLOPS if part in name), None)


def flops_per_token(parameters: int, n_layer: int, n_embd: int, context: int, embedding: int = 0) -> float:
    """Training FLOPs per token of a decoder: 6 per weight that multiplies (embedding lookups excluded) plus attention's
    scores and mix, 12 x layers x width x context (the forward's 2 x 2 x L x d x T, three times with the backward)."""
    return 6.0 * (parameters - embedding) + 12.0 * n_layer * n_embd * context


def device_of(model: torch.nn.Module) -> torch.device:
    """Where a model's weights are (the CPU for a model without any): where its inputs go."""
    import itertools

    import torch

    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    return first.device if first is not None else torch.device("cpu")
