"""The training run tests/train launches as a process of its own: `python -m tests.train.trainer WORK STEPS EVERY ACCUM
DROPOUT`, or each rank of one under torchrun. The same synthetic blend on every launch; the checkpoint format, asynchronous
saves, parallelism, more pretrain fields and a control section come from the environment (see `launch` in test_resume.py)."""

import json
import logging
import os
import sys
from pathlib import Path

import torch

from factory.config.control import ControlConfig
from factory.config.schema import ModelConfig, PretrainConfig
from factory.data.loader import Batch, LoaderState
from factory.train.distributed import join, leave, world_from_env
from factory.train.pretrain import pretrain


def main() -> None:
    work, steps, every, accum, dropout = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    model = ModelConfig(n_layer=2, n_head=2, n_embd=64, context=32, dropout=dropout)
    config = PretrainConfig(steps=steps, batch_size=8, lr=3e-3, warmup_steps=2, checkpoint_every=every, log_every=1,
                            keep_last=2, grad_accum_steps=accum, checkpoint_format=os.environ.get("FORMAT", "file"),
                            async_checkpoints=os.environ.get("ASYNC") == "1", parallelism=os.environ.get("PARALLELISM", "ddp"),
                            **json.loads(os.environ.get("EXTRA") or "{}"))
    world = world_from_env()
    (work.parent / f"rank-{world.rank}.pid").write_text(str(os.getpid()))  # which process is which rank, for a test to kill one
    join(world)

    def data(state):
        step = state.slot if state else 0
        generator = torch.Generator().manual_seed(1234)
        tokens = torch.randint(0, 64, (5000,), generator=generator)
        share = config.batch_size // world.size
        while True:
            starts = [(step * 37 + 13 * i) % 4900 for i in range(config.batch_size)]
            seqs = torch.stack([tokens[s : s + model.context + 1] for s in starts])
            seqs[:, -3:] = -1  # padding at the end, as packed sequences have
            mine = seqs[world.rank * share : (world.rank + 1) * share]
            x, y = mine[:, :-1].clone(), mine[:, 1:].clone()
            x[x < 0] = 0
            step += 1
            yield Batch(x=x, y=y, documents=(), state=LoaderState(slot=step), real_tokens=int((y >= 0).sum()),
                        global_tokens=int((seqs[:, 1:] >= 0).sum()))

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    control = ControlConfig.model_validate_json(os.environ["CONTROL"]) if os.environ.get("CONTROL") else None
    pretrain(data, 64, model, config, 7, work, logging.getLogger("trainer"), world=world, control=control)
    leave(world)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as a stage's ranks end (`exit_now`): a thread torch leaves joinable can abort the interpreter's exit
