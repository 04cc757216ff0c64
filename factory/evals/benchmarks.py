"""The benchmarks an experiment may name in `eval.benchmarks`, with their metric direction."""

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Benchmark:
    """A registered benchmark."""

    name: str
    version: int
    lower_is_better: bool
    description: str


BENCHMARKS = {
    "val_bpb": Benchmark(name="val_bpb", version=1, lower_is_better=True, description="validation bits per byte on held-out stdlib files"),
}
