"""The `sft.data` section: any pinned table version (or a dataset of the file) to fine-tune on, its column mapping and its
chat template."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ValidationInfo, field_validator, model_validator

from factory.config.section import GrownSection
from factory.config.table_refs import table_ref


DEFAULT_CHAT_TEMPLATES = {
    "prompt_completion": "{% for message in messages %}{{ message.content }}{% endfor %}",
    "messages": "{% for message in messages %}<|{{ message.role }}|>\n{{ message.content }}\n{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
}
"""The chat template of each `sft.data.format` when none is given."""


def chat_environment() -> Any:
    """The sandbox every chat template is compiled in: an undefined variable is an error (not empty text), and a trailing
    newline is kept."""
    from jinja2 import StrictUndefined
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    return ImmutableSandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True)


def render_errors() -> tuple[type[Exception], ...]:
    """What rendering a compiled template on a conversation can raise: the template's own errors, or its expressions' on
    the data."""
    from jinja2 import TemplateError

    return TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError


def template_problem(template: str) -> str | None:
    """Why a Jinja2 template does not parse (with its line), or None when it does."""
    from jinja2 import TemplateSyntaxError

    try:
        chat_environment().parse(template)
    except TemplateSyntaxError as e:
        return f"the template does not parse: line {e.lineno} of the template: {e.message}"
    return None


SAMPLE_TURNS = {
    "prompt_completion": [{"role": "user", "content": "2 + 2 ="}, {"role": "assistant", "content": " 4"}],
    "messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "2 + 2?"},
                 {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "6"}],
}
"""A conversation of each format that a template must render before any row is read (so `factory check` refuses one
that cannot render any conversation)."""


def render_problem(template: str, format: str) -> str | None:
    """Why a template that parses does not render a sample conversation of `format` (the turns before each assistant turn
    with the generation prompt, and up to it without, as fine-tuning renders them), or None when it does."""
    render = chat_environment().from_string(template).render
    turns = SAMPLE_TURNS[format]
    for index in (i for i, turn in enumerate(turns) if turn["role"] == "assistant"):
        for upto, generation in ((index, True), (index + 1, False)):
            try:
                render(messages=turns[:upto], add_generation_prompt=generation)
            except render_errors() as e:
                return (f"the template does not render a {format} conversation of {upto} turns ({type(e).__name__}: {e}); it "
                        "gets 'messages' (a list of {role, content}) and 'add_generation_prompt' and nothing else")
    return None


class SFTData(GrownSection):
    """Any pinned table version to fine-tune on: which columns hold the examples and how they are rendered into text.

    Each row becomes a conversation (`messages`: the row's list of `{role, content}` turns; `prompt_completion`: a
    `user` turn of the prompt and an `assistant` turn of the completion). The chat template renders it; the loss counts
    the text of the assistant turns only (each followed by the end-of-text token): the text up to an assistant turn is
    the template rendered with the turns before it and `add_generation_prompt` true, the turn's text is what rendering
    it with the turn adds to that.
    """

    UNSET_LEFT_OUT = ("dataset",)

    table: str | None = None
    """The table version, pinned as `namespace.table@tag` (it must exist with the mapped columns: `factory check` verifies)."""
    dataset: str | None = None
    """Instead of `table`: a dataset of this file's `data.datasets`, read at the version its `filtered_datasets` stage
    writes (its source must keep the mapped columns: `factory check` verifies). The data stages compute it also when it
    is not blended."""
    format: Literal["prompt_completion", "messages"] = "prompt_completion"
    """`prompt_completion`: a prompt column and a completion column of text; `messages`: one column of chat turns."""
    prompt: str = "prompt"
    """For `prompt_completion`: the column of prompt text."""
    completion: str = "completion"
    """For `prompt_completion`: the column of completion text (the text the loss counts)."""
    messages: str = "messages"
    """For `messages`: the column of turns, a list of `{role, content}` records or a JSON string of one; the loss counts
    the turns whose role is `assistant`."""
    split: str | None = None
    """A column that selects the training rows with `split_value` (null: every row trains)."""
    split_value: str = "train"
    """The value of the `split` column of the rows that train."""
    chat_template: str | None = None
    """A Jinja2 template that renders `messages` (a list of `{role, content}`) and `add_generation_prompt` into text; it is
    copied next to the checkpoints and into the exported model. Null: the template of the model SFT starts from (the
    checkpoint `model.from_hf` names, or a model made elsewhere that was fine-tuned with one), else for
    `prompt_completion` the turns' text joined with nothing between (prompt then completion), for `messages` `<|role|>`
    and a newline before each turn's text, a newline after it, and `<|assistant|>` and a newline as the generation
    prompt."""

    @field_validator("table")
    @classmethod
    def _table_is_a_ref(cls, value: str | None) -> str | None:
        return table_ref(value) if value is not None else None

    @model_validator(mode="after")
    def _one_origin(self) -> SFTData:
        if (self.table is None) == (self.dataset is None):
            raise ValueError("give exactly one of 'table' ('namespace.table@tag') or 'dataset' (defined in data.datasets)")
        return self

    @field_validator("prompt", "completion", "messages", "split")
    @classmethod
    def _column_is_named(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("expected a column name, found an empty string")
        return value

    @field_validator("chat_template")
    @classmethod
    def _template_renders(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and (problem := template_problem(value)):
            raise ValueError(f"{problem}; fix the template's Jinja2 syntax")
        if value is not None and "format" in info.data and (problem := render_problem(value, info.data["format"])):
            raise ValueError(problem)
        return value

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns the table must have: the mapped ones of the format, and the split column."""
        mapped = (self.prompt, self.completion) if self.format == "prompt_completion" else (self.messages,)
        return (*mapped, *((self.split,) if self.split is not None else ()))

    @property
    def label(self) -> str:
        """What the rows are read from, as messages name it."""
        return self.table if self.table is not None else f"dataset {self.dataset!r}"

    @property
    def template(self) -> str:
        """The given chat template, or the format's default (the SFT stage renders with the starting model's before the
        default: `factory.stages.sft.chat_template`)."""
        return self.chat_template if self.chat_template is not None else DEFAULT_CHAT_TEMPLATES[self.format]
