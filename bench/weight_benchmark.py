"""A benchmark that costs next to nothing (mean absolute weight), so bench/eval_backfill.py times orchestration alone."""

from factory.evals.benchmarks import Benchmark, EvalInputs, Score, register


def mean_abs_weight(inputs: EvalInputs) -> Score:
    weights = [p.detach().abs().mean().item() for p in inputs.model.parameters()]
    return Score(value=sum(weights) / len(weights), count=len(weights))


register(Benchmark(name="mean_abs_weight", version=1, lower_is_better=True, run=mean_abs_weight, description="mean absolute weight (bench only)"))
