"""What a benchmark is: the inputs it scores a model on, the score it returns, and its registered definition.

Kept apart from the registry (`factory.evals.benchmarks`) so that benchmark code imports these
types without importing the registry that loads it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
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
    """The checkpoint's model, in eval mode on the CPU; `model(idx)` gives logits (batch, time, vocab)."""
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
