"""Fine-tuning examples from any table: rows read through the column mapping of `sft.data`, rendered by its chat template.

Each row is a conversation of `{role, content}` turns (a `prompt_completion` row is a user turn and an assistant turn).
The text before an assistant turn is the template rendered with the turns before it and `add_generation_prompt`; the
turn's own text is what rendering it with that turn adds. So the loss counts exactly what the model writes when it is
prompted the way the exported template prompts it, and a template that rewrites earlier text is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from jinja2 import TemplateError
from pyiceberg.catalog import Catalog
from pyiceberg.expressions import AlwaysTrue, EqualTo
from tokenizers import Tokenizer

from factory.config.sft_data import SFTData, chat_environment, render_errors
from factory.data.tables import parse_ref, resolve_pin
from factory.errors import ArtifactError, ConfigError
from factory.post.sft import Example, encode_segments, fitting

ASSISTANT = "assistant"
"""The role of the turns the loss counts."""
Render = Callable[..., str]


def read_rows(catalog: Catalog, data: SFTData, ref: str | None = None) -> tuple[int, list[dict[str, Any]]]:
    """The snapshot `ref` (default: `data.table`) names and its training rows (those of the split, or all), mapped columns
    only, in the snapshot's order; a clear error when the version is missing or selects no row."""
    ref = ref or data.table
    assert ref is not None, "a dataset's rows are read at the version its filtered_datasets stage wrote"
    table_name, tag = parse_ref(ref)
    try:
        snapshot = resolve_pin(catalog, table_name, tag)
    except ArtifactError as e:
        raise ConfigError(f"sft.data.{'table' if data.table else 'dataset'}: {e}") from e
    where = EqualTo(data.split, data.split_value) if data.split is not None else AlwaysTrue()
    rows = catalog.load_table(table_name).scan(row_filter=where, snapshot_id=snapshot, selected_fields=data.columns).to_arrow().to_pylist()
    if not rows:
        selected = f" with {data.split} == {data.split_value!r}" if data.split is not None else ""
        raise ConfigError(f"{ref} has no rows{selected}: pin a version that has training rows, or change sft.data.split_value")
    return snapshot, rows


def conversation(row: dict[str, Any], data: SFTData, name: str) -> list[dict[str, str]]:
    """The turns of one row: its messages column (records or JSON), or its prompt and completion as a user and an
    assistant turn."""
    if data.format == "prompt_completion":
        prompt, completion = row[data.prompt], row[data.completion]
        if not isinstance(prompt, str) or not isinstance(completion, str):
            raise ConfigError(f"{name}: columns {data.prompt!r} and {data.completion!r} must hold text, found "
                              f"{type(prompt).__name__} and {type(completion).__name__}; map text columns in sft.data")
        return [{"role": "user", "content": prompt}, {"role": ASSISTANT, "content": completion}]
    turns = row[data.messages]
    if isinstance(turns, str):
        try:
            turns = json.loads(turns)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{name}: column {data.messages!r} is not JSON ({e}); store a list of {{role, content}} records") from e
    if not isinstance(turns, list) or not all(isinstance(t, dict) and isinstance(t.get("role"), str) and isinstance(t.get("content"), str) for t in turns):
        raise ConfigError(f"{name}: column {data.messages!r} must be a list of {{role, content}} records of text, found {str(turns)[:120]!r}")
    if not any(t["role"] == ASSISTANT for t in turns):
        raise ConfigError(f"{name}: no {ASSISTANT!r} turn, so nothing to learn; give each row an assistant turn or select rows with sft.data.split")
    return [{"role": t["role"], "content": t["content"]} for t in turns]


def compile_template(template: str) -> Render:
    """The template's render function (sandboxed; an undefined variable is an error, not empty text)."""
    try:
        return chat_environment().from_string(template).render
    except TemplateError as e:
        raise ConfigError(f"sft.data.chat_template does not parse: {e}; fix the template's Jinja2 syntax") from e


def segments(render: Render, turns: list[dict[str, str]], name: str) -> list[tuple[str, bool]]:
    """The text of a conversation as segments, each marked whether the loss counts it (the assistant turns)."""
    def text(upto: int, generation: bool) -> str:
        try:
            return render(messages=turns[:upto], add_generation_prompt=generation)
        except render_errors() as e:
            raise ConfigError(f"sft.data.chat_template does not render {name}: {type(e).__name__}: {e}; the template gets "
                              "'messages' (a list of {role, content}) and 'add_generation_prompt'") from e

    found: list[tuple[str, bool]] = []
    done = ""
    for index, turn in enumerate(turns):
        if turn["role"] != ASSISTANT:
            continue
        prompt, whole = text(index, True), text(index + 1, False)
        if not prompt.startswith(done) or not whole.startswith(prompt):
            raise ConfigError(f"sft.data.chat_template renders {name} so that the text before assistant turn {index} changes as "
                              "turns are added; the template must render each turn after the text of the turns before it")
        found += [(prompt[len(done):], False), (whole[len(prompt):], True)]
        done = whole
    return [(piece, counts) for piece, counts in found if piece or counts]


def chat_examples(rows: list[dict[str, Any]], data: SFTData, tokenizer: Tokenizer, eos_id: int, context: int) -> list[Example]:
    """Tokenize the rows through the mapping and the template; the loss counts the assistant turns only."""
    render = compile_template(data.template)
    examples = []
    for index, row in enumerate(rows):
        name = f"row {index} of {data.label}"
        example = encode_segments(str(index), segments(render, conversation(row, data, name), name), tokenizer, eos_id, context)
        if example is not None:
            examples.append(example)
    return fitting(examples, context)
