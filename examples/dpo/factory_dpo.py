"""The `dpo` stage kind: Direct Preference Optimization of a model on preference pairs, against a frozen reference.

Each pair is a prompt with a chosen and a rejected completion. DPO raises the policy's log-probability of the chosen
completion over the rejected one, measured against the reference model (a frozen copy of the weights the stage starts
from): the loss of one pair is `-log sigmoid(beta * ((pc - pr) - (rc - rr)))`, with `pc`, `pr` the policy's summed
log-probabilities of the chosen and rejected completion tokens given the prompt, and `rc`, `rr` the reference's.

The pairs are the rows of a dataset of the experiment file (`dpo.data.dataset`, e.g. a JSONL or Parquet source keeping
the columns `prompt`, `chosen`, `rejected`), which the data stages ingest, dedup and filter for this stage. The stage
starts from the file's last training stage (its SFT, say), or from another experiment's model (`dpo.from`), and the
platform's loop trains it: ranks, precision, checkpoints evaluated as `checkpoints` partitions, bitwise resume, and the
model stage exports its final weights when it ends the chain. Everything here comes from `factory.plugin`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pydantic import Field

from factory.plugin import PAD, REFERENCE, ConfigError, DatasetNeed, Section, TrainingInputs, TrainingSection, training_kind

if TYPE_CHECKING:
    import torch

    from factory.plugin import Batch, LoaderState


class PreferenceData(Section):
    """Where the preference pairs are: a dataset of the file and the columns that hold each part of a pair."""

    dataset: str
    """A dataset of the file's `data.datasets` whose source keeps the three columns (`source.columns`)."""
    prompt: str = "prompt"
    """The column holding the prompt."""
    chosen: str = "chosen"
    """The column holding the preferred completion."""
    rejected: str = "rejected"
    """The column holding the dispreferred completion."""

    @property
    def columns(self) -> tuple[str, str, str]:
        return self.prompt, self.chosen, self.rejected


class DPOConfig(TrainingSection):
    """Direct Preference Optimization: the pairs, beta, and every training knob (`steps`, `batch_size` in pairs, `lr`, ...)."""

    data: PreferenceData
    beta: float = Field(0.1, gt=0, le=100)
    """How far the policy may move from the reference: the scale of the log-ratio margin inside the sigmoid."""


def pair_loss(policy: torch.Tensor, reference: torch.Tensor, beta: float) -> torch.Tensor:
    """The DPO loss of each pair, given (pairs, 2) summed log-probabilities of [chosen, rejected] under the policy and the
    reference: `-log sigmoid(beta * ((pc - pr) - (rc - rr)))`."""
    from torch.nn import functional as F

    margin = (policy[:, 0] - policy[:, 1]) - (reference[:, 0] - reference[:, 1])
    return -F.logsigmoid(beta * margin)


def loss(model: Any, x: torch.Tensor, y: torch.Tensor, frozen: dict[str, Any], config: DPOConfig) -> torch.Tensor:
    """The summed DPO loss of a micro-batch of pairs: `x` and `y` are (pairs, 2, time), chosen then rejected."""
    import torch

    from factory.plugin import sequence_log_probs

    pairs, _, time = x.shape
    flat_x, flat_y = x.reshape(pairs * 2, time), y.reshape(pairs * 2, time)
    policy = sequence_log_probs(model, flat_x, flat_y).view(pairs, 2)
    with torch.no_grad():
        reference = sequence_log_probs(frozen[REFERENCE], flat_x, flat_y).view(pairs, 2)
    return pair_loss(policy, reference, config.beta).sum()


def encode(prompt: str, completion: str, inputs: TrainingInputs) -> tuple[list[int], list[bool]]:
    """A prompt and one completion as tokens (the completion followed by end of text), and which of them the loss counts
    (the completion's); a prompt too long for the context keeps its end."""
    head = inputs.tokenizer.encode(prompt).ids
    tail = inputs.tokenizer.encode(completion).ids + [inputs.eos_id]
    if len(tail) >= inputs.context:
        raise ConfigError(f"a completion of {len(tail)} tokens does not fit a context of {inputs.context}: raise model.context")
    ids = (head + tail)[-(inputs.context + 1):]
    return ids, [False] * (len(ids) - len(tail)) + [True] * len(tail)


def batches(inputs: TrainingInputs) -> Any:
    """The batch source: global batches of `batch_size` pairs in a seeded order, a fresh one each epoch; this rank's slice."""
    import torch

    from factory.plugin import Batch, LoaderState

    config: DPOConfig = inputs.section
    rows = inputs.rows(config.data.dataset, config.data.columns)
    pairs = []
    for row in rows:
        prompt, chosen, rejected = (row[column] for column in config.data.columns)
        if all(isinstance(value, str) for value in (prompt, chosen, rejected)):
            pairs.append((encode(prompt, chosen, inputs), encode(prompt, rejected, inputs)))
    if not pairs:
        raise ConfigError(f"dataset {config.data.dataset!r} has no row with text in {', '.join(config.data.columns)}")
    world = inputs.world
    if config.batch_size % world.size:
        raise ConfigError(f"dpo.batch_size ({config.batch_size}) must be divisible by the number of ranks ({world.size})")
    per_rank = config.batch_size // world.size
    inputs.summary.update({"pairs": len(pairs), "beta": config.beta})
    inputs.log.info("DPO on %d preference pairs of dataset %s", len(pairs), config.data.dataset)

    def tensors(chosen: list[tuple[list[int], list[bool]]]) -> tuple[torch.Tensor, torch.Tensor]:
        length = max(len(ids) for pair in chosen for ids, _ in pair) - 1
        x = torch.full((len(chosen), 2, length), inputs.eos_id, dtype=torch.int64)
        y = torch.full((len(chosen), 2, length), PAD, dtype=torch.int64)
        for row, pair in enumerate(chosen):
            for side, (ids, counted) in enumerate(pair):
                n = len(ids) - 1
                x[row, side, :n] = torch.tensor(ids[:-1])
                y[row, side, :n] = torch.tensor([token if keep else PAD for token, keep in zip(ids[1:], counted[1:], strict=True)])
        return x, y

    def source(state: LoaderState | None) -> Iterator[Batch]:
        consumed = state.slot if state is not None else 0
        orders: dict[int, list[int]] = {}
        while True:
            picked = []
            for position in range(consumed, consumed + config.batch_size):
                epoch, within = divmod(position, len(pairs))
                if epoch not in orders:
                    orders = {epoch: order(len(pairs), inputs.settings.seed, epoch)}
                picked.append(pairs[orders[epoch][within]])
            consumed += config.batch_size
            mine = picked[world.rank * per_rank:(world.rank + 1) * per_rank]
            x, y = tensors(mine)
            completion_tokens = sum(sum(counted) for pair in picked for _, counted in pair)
            yield Batch(x=x, y=y, documents=(), state=LoaderState(slot=consumed), real_tokens=int((y != PAD).sum()),
                        global_tokens=completion_tokens, loss_units=config.batch_size)

    return source


def order(count: int, seed: int, epoch: int) -> list[int]:
    """The seeded order of the pairs in one epoch."""
    indices = list(range(count))
    random.Random(f"dpo:{seed}:{epoch}").shuffle(indices)
    return indices


DPO = training_kind(
    name="dpo",
    description="Direct Preference Optimization on (prompt, chosen, rejected) pairs against a frozen copy of the model it starts "
                "from; its checkpoints are `checkpoints` partitions.",
    config=DPOConfig,
    batches=batches,
    loss=loss,
    frozen=(REFERENCE,),
    datasets=lambda config: [DatasetNeed(where=("data", "dataset"), dataset=config.data.dataset, columns=config.data.columns)],
)
