"""Model FLOPs utilisation: what every metrics row of a training stage on a GPU says about how busy its GPUs were.

`flops_per_token` counts what the model's arithmetic costs per trained token (`factory.devices.flops_per_token`:
6 per weight that multiplies, plus attention over the context); `tokens_per_second_per_gpu` is the interval's
throughput over the ranks; `mfu` divides their product by the GPU's dense bf16 peak, from the table in
`factory.devices`. A GPU the table does not know gets the first two and no `mfu` (said once in the log), rather than
a guess; on the CPU rows carry none of them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from torch import nn

from factory.config.schema import ModelConfig
from factory.devices import flops_per_token, peak_flops
from factory.models.build import count_parameters
from factory.train.distributed import World


@dataclass(frozen=True, kw_only=True, slots=True)
class Utilisation:
    """How to turn an interval's tokens/s into the row's utilisation figures."""

    flops_per_token: float | None
    """None: the stage runs on the CPU, and its rows carry no utilisation."""
    gpus: int = 1
    peak: float | None = None
    """The bf16 FLOP/s of one GPU (None: not in the table)."""

    @classmethod
    def of(cls, model: nn.Module, config: ModelConfig, world: World, log: logging.Logger) -> Utilisation:
        """The figures of `model` trained on `world`'s devices (the device of every rank is the same kind)."""
        device = world.device
        if device.type != "cuda":
            return cls(flops_per_token=None)
        peak = peak_flops(device)
        if peak is None and world.is_main:
            import torch

            log.warning("no bf16 peak is known for %s: metrics rows carry tokens/s per GPU and FLOPs per token, but no MFU "
                        "(add it to factory.devices.PEAK_BF16_TFLOPS)", torch.cuda.get_device_name(device))
        per_token = flops_per_token(count_parameters(model), config.n_layer, config.n_embd, config.context,
                                    embedding=lookup_parameters(model))
        return cls(flops_per_token=per_token, gpus=world.size, peak=peak)

    def row(self, tokens_per_second: float) -> dict[str, float]:
        """The utilisation keys of a metrics row, from the interval's tokens/s over all ranks."""
        if self.flops_per_token is None:
            return {}
        per_gpu = tokens_per_second / self.gpus
        row = {"flops_per_token": round(self.flops_per_token), "tokens_per_second_per_gpu": round(per_gpu, 1)}
        if self.peak is not None:
            row["mfu"] = round(per_gpu * self.flops_per_token / self.peak, 4)
        return row


def lookup_parameters(model: nn.Module) -> int:
    """Parameters only looked up, never multiplied: embedding tables, unless a linear layer shares the matrix (tied)."""
    multiplied = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Embedding) and id(m.weight) not in multiplied)
