"""Code-execution output prediction: given a held-out function and a call, does the model write what the call returns?

The tasks are the test split of `post.code_exec_tasks@v1` (the `code_exec_tasks` asset), the first
TASKS by id: a pinned table version, so scores stay comparable; a new task set means a new
benchmark version. The prompt and answer are written as `factory.post.format` says (the format fine-tuning
uses); the answer is what the model writes greedily up to the end of the line, compared with the
executed output as a Python value.
"""

from __future__ import annotations

from factory.errors import ConfigError
from factory.evals.base import EvalInputs, Score
from factory.models.generate import generate
from factory.models.sampling import Sampling
from factory.post.format import answer, prompt
from factory.post.sft import read_tasks

TABLE = "post.code_exec_tasks"
TAG = "v1"
TASKS = 64
NEW_TOKENS = 24


def test_tasks(inputs: EvalInputs) -> list[dict]:
    """The pinned test tasks; a clear error when the task set was never generated."""
    if inputs.catalog is None:
        raise ConfigError("the code_exec benchmark needs the Iceberg catalog; it was not given one")
    return read_tasks(inputs.catalog, f"{TABLE}@{TAG}", "test")[:TASKS]


def code_exec_accuracy(inputs: EvalInputs) -> Score:
    """Share of held-out calls whose output the model writes exactly."""
    if inputs.context <= 2 * NEW_TOKENS:
        raise ConfigError(f"the code_exec benchmark needs a context above {2 * NEW_TOKENS} tokens; the model has {inputs.context}")
    tasks = test_tasks(inputs)
    encoded = [inputs.tokenizer.encode(prompt(t["function"], t["call"])).ids for t in tasks]
    prompts = [ids[-(inputs.context - NEW_TOKENS):] for ids in encoded]
    cut = sum(len(ids) > len(kept) for ids, kept in zip(encoded, prompts, strict=True))
    # No stop at end-of-text: the answer is the first line of everything written, as it always was.
    done = generate(inputs.model, prompts, Sampling(new_tokens=NEW_TOKENS), context=inputs.context, batch_size=inputs.batch_size)
    answers = {i: answer(inputs.tokenizer.decode(list(c.tokens))) for i, c in enumerate(done)}
    right = sum(answers[i] == answer(t["expected"]) for i, t in enumerate(tasks))
    examples = [{"call": t["call"], "expected": t["expected"], "got": answers[i]} for i, t in enumerate(tasks[:3])]
    details = {"right": right, "tasks": len(tasks), "prompts_cut_to_context": cut, "examples": examples}
    return Score(value=right / len(tasks), count=len(tasks), details=details)
