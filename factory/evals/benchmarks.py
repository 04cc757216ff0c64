"""The benchmark registry: each benchmark is a name, a version, a metric direction and a function.

A benchmark scores one model on what `EvalInputs` gives it and returns a `Score`. It must be
deterministic (seeded from `inputs.seed`) and batched (`inputs.batch_size` sequences per forward
pass). Changing what a benchmark measures means a new `version`: results of other versions are
never compared with it. A benchmark also says what data it is scored on (`data`): each
experiment's own held-out split, or data every experiment shares; only scores of the same
benchmark version on the same data are compared (`factory.evals.scored_on`). Installed packages declare more
benchmarks as plugins, like stage kinds, source kinds and architectures (entry-point group `model_factory.benchmarks`;
their code is part of each score's fingerprint: `Benchmark.code`), and so do the modules the `benchmarks` setting names
(factory.toml, or FACTORY_BENCHMARKS: `factory.config.settings`), for a repository's own.
"""

from __future__ import annotations

import importlib
import re

from factory.config.settings import BENCHMARKS_ENV, load_settings
from factory.errors import ConfigError
from factory.evals.base import Benchmark, EvalInputs, Score

__all__ = ["BENCHMARKS", "Benchmark", "EvalInputs", "Score", "benchmark", "known", "register", "registered"]


BENCHMARKS: dict[str, Benchmark] = {}
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
GROUP = "model_factory.benchmarks"
"""The entry-point group a package declares benchmarks in: `name = "module:BENCHMARK"`, a `Benchmark` named after the entry point."""
SHIPPED = "factory.evals.suite"
"""The module whose import registers the benchmarks the factory ships: loaded by name, as plugins are (it imports this registry)."""


def register(benchmark: Benchmark) -> Benchmark:
    """Add a benchmark to the registry; a second benchmark of the same name is an error."""
    if not NAME.fullmatch(benchmark.name):
        raise ConfigError(f"benchmark name {benchmark.name!r}: use letters, digits, '_', '.' and '-' only (it is a partition key)")
    if benchmark.name in BENCHMARKS and BENCHMARKS[benchmark.name] is not benchmark:
        raise ConfigError(f"a benchmark named {benchmark.name!r} is already registered; pick another name")
    BENCHMARKS[benchmark.name] = benchmark
    return benchmark


def _load() -> None:
    """Register the shipped benchmarks, those installed packages declare (entry-point group `model_factory.benchmarks`), and
    those of the modules the `benchmarks` setting names (the current repository's)."""
    from factory.config.plugins import load_declarations

    importlib.import_module(SHIPPED)
    for _, declared in load_declarations(GROUP, Benchmark, "benchmark"):
        register(declared)
    for module in load_settings().benchmarks:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"the benchmarks setting (factory.toml or {BENCHMARKS_ENV}) names module {module!r}, which does not "
                              f"import ({e}); fix the name or install it") from e


def benchmark(name: str) -> Benchmark:
    """The registered benchmark called `name`, or a ConfigError listing the known ones. A name registered already is
    answered at once (a backfill asks for each of ten thousand partitions); the plugins and settings are read for one
    that is not."""
    if name in BENCHMARKS:
        return BENCHMARKS[name]
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
