"""The benchmark registry: each benchmark is a name, a version, a metric direction and a function.

A benchmark scores one model on what `EvalInputs` gives it and returns a `Score`. It must be
deterministic (seeded from `inputs.seed`) and batched (`inputs.batch_size` sequences per forward
pass). Changing what a benchmark measures means a new `version`: results of other versions are
never compared with it. A benchmark also says what data it is scored on (`data`): each
experiment's own held-out split, or data every experiment shares; only scores of the same
benchmark version on the same data are compared (`factory.evals.scored_on`). Modules named in
FACTORY_BENCHMARKS register more benchmarks.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from factory.errors import ConfigError

if TYPE_CHECKING:  # `factory check` reads the registry without importing torch
    from pyiceberg.catalog import Catalog
    from tokenizers import Tokenizer
    from torch import nn


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


BENCHMARKS: dict[str, Benchmark] = {}
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
PLUGINS_ENV = "FACTORY_BENCHMARKS"
"""Comma-separated modules that register more benchmarks with `register` (your own, without editing the factory)."""


def register(benchmark: Benchmark) -> Benchmark:
    """Add a benchmark to the registry; a second benchmark of the same name is an error."""
    if not NAME.fullmatch(benchmark.name):
        raise ConfigError(f"benchmark name {benchmark.name!r}: use letters, digits, '_', '.' and '-' only (it is a partition key)")
    if benchmark.name in BENCHMARKS and BENCHMARKS[benchmark.name] is not benchmark:
        raise ConfigError(f"a benchmark named {benchmark.name!r} is already registered; pick another name")
    BENCHMARKS[benchmark.name] = benchmark
    return benchmark


def _load() -> None:
    """Register the shipped benchmarks, and those of the modules named in FACTORY_BENCHMARKS."""
    from factory.evals import suite  # noqa: F401  (the shipped benchmarks register themselves)

    for module in filter(None, (name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(","))):
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"{PLUGINS_ENV} names module {module!r}, which does not import ({e}); fix the name or install it") from e


def benchmark(name: str) -> Benchmark:
    """The registered benchmark called `name`, or a ConfigError listing the known ones."""
    _load()
    if name not in BENCHMARKS:
        from factory.evals.custom import custom_benchmark  # prompts saved from Podium: `custom_prompts.v<n>`

        if (custom := custom_benchmark(name)) is not None:
            register(custom)
    try:
        return BENCHMARKS[name]
    except KeyError:
        raise ConfigError(f"unknown benchmark {name!r}; registered: {', '.join(sorted(BENCHMARKS))}") from None


def known(name: str) -> bool:
    """Whether `name` is a registered benchmark, or one its name stands for (`custom_prompts.v<n>`)."""
    try:
        benchmark(name)
    except ConfigError:
        return False
    return True


def registered() -> dict[str, Benchmark]:
    """Every registered benchmark, by name."""
    _load()
    return dict(BENCHMARKS)
