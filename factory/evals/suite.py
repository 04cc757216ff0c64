"""The benchmarks the factory ships; importing this module registers them.

Their code is imported when a benchmark runs, so reading the registry (`factory check`) stays light.
"""

from __future__ import annotations

from factory.evals.base import Benchmark, EvalInputs, Score
from factory.evals.benchmarks import register
from factory.evals.heldout import REF as HELDOUT


def validation_bpb(inputs: EvalInputs) -> Score:
    """Bits per byte of the held-out split, up to `max_bytes` of it."""
    from factory.evals.bpb import bits_per_byte, validation_tokens
    from factory.models.tokenizer import token_byte_lengths

    tokens = validation_tokens(inputs.validation_texts(), inputs.tokenizer, inputs.eos_id, inputs.max_bytes)
    result = bits_per_byte(inputs.model, tokens, token_byte_lengths(inputs.tokenizer), inputs.context, inputs.batch_size)
    return Score(value=result.bpb, count=result.bytes, details={"tokens": result.tokens, "bytes": result.bytes})


VAL_BPB = register(Benchmark(
    name="val_bpb", version=1, lower_is_better=True, run=validation_bpb,
    description="validation bits per byte on the blend's held-out split (the experiment's own: compares only with experiments "
                "of the same blend)",
))


def heldout_bpb(inputs: EvalInputs) -> Score:
    """Bits per byte of every document of the pinned table version all experiments share."""
    from factory.evals.heldout import heldout_bpb as score

    return score(inputs)


HELDOUT_BPB = register(Benchmark(
    name="heldout_bpb", version=1, lower_is_better=True, run=heldout_bpb, data=HELDOUT,
    description=f"bits per byte of every document of {HELDOUT} (generated Python functions no experiment trains on), "
                "the same pinned data for every experiment: comparable across experiments",
))


def next_line(inputs: EvalInputs) -> Score:
    """Share of held-out function-body lines the model completes exactly, greedily."""
    from factory.evals.next_line import next_line_exact_match

    return next_line_exact_match(inputs)


NEXT_LINE = register(Benchmark(
    name="next_line", version=1, lower_is_better=False, run=next_line,
    description="exact match of the next line of held-out Python functions, 64 seeded lines, greedy decoding",
))


def python_sanity(inputs: EvalInputs) -> Score:
    """Share of seeded samples from fixed Python prompts that are valid Python or a valid start of it."""
    from factory.evals import sanity

    return sanity.python_sanity(inputs)


PYTHON_SANITY = register(Benchmark(
    name="python_sanity", version=1, lower_is_better=False, run=python_sanity, data="fixed prompts",
    description="share of 32 seeded samples (96 tokens at temperature 0.8) that are valid Python or a valid prefix",
))


def code_exec(inputs: EvalInputs) -> Score:
    """Share of held-out code-execution tasks whose output the model writes exactly."""
    from factory.evals.code_exec import code_exec_accuracy

    return code_exec_accuracy(inputs)


CODE_EXEC = register(Benchmark(
    name="code_exec", version=1, lower_is_better=False, run=code_exec, data="post.code_exec_tasks@v1",
    description="exact output of 64 held-out function calls (test split of post.code_exec_tasks@v1), greedy decoding",
))
