"""Prompting a fine-tuned model the way it was fine-tuned: a conversation rendered through the model's own chat template.

A model fine-tuned on chat data carries the template SFT rendered its examples with (`chat_template.jinja` beside its
checkpoints and in its exported directory). Podium prompts it with the turns of a conversation rendered through that
template with the generation prompt, so the completion is the model's next assistant turn. A conversation is either a
JSON list of `{role, content}` turns (what a `messages` column holds) or plain text, which is one user turn.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from factory.config.sft_data import render_errors
from factory.data.ingest import turns_of
from factory.errors import ConfigError
from factory.post.chat import ASSISTANT, Render, compile_template
from factory.podium.errors import PodiumError

Turns = list[dict[str, str]]


@dataclass(frozen=True, kw_only=True, slots=True)
class Sampled:
    """A conversation taken from a row: the turns before its last assistant turn, and that turn (the reference reply)."""

    prompt: str
    """The turns before the reply, as the JSON list the prompt box holds."""
    reply: str


def turns_in(text: str) -> Turns | None:
    """The turns of `text` when it is a JSON list of `{role, content}` records of text (as ingest keeps a `messages`
    column); None otherwise."""
    if not text.lstrip().startswith("["):
        return None
    try:
        return turns_of(json.loads(text))
    except json.JSONDecodeError:
        return None


def sampled(text: str) -> Sampled | None:
    """A row's conversation split before its last assistant turn; None when the text holds no such conversation."""
    turns = turns_in(text)
    if turns is None:
        return None
    last = max((i for i, turn in enumerate(turns) if turn["role"] == ASSISTANT), default=None)
    if last is None:
        return Sampled(prompt=json.dumps(turns, ensure_ascii=False), reply="")
    return Sampled(prompt=json.dumps(turns[:last], ensure_ascii=False), reply=turns[last]["content"])


@functools.lru_cache(maxsize=32)
def _compiled(template: str) -> Render:
    """A chat template compiled once: every completion of a model renders with it."""
    return compile_template(template)


def rendered(prompt: str, template: Path | None) -> str:
    """The text a model is prompted with for the conversation `prompt`: rendered through its chat template with the
    generation prompt, or, for a model fine-tuned without one, the turns' text one per line."""
    turns = turns_in(prompt) or [{"role": "user", "content": prompt}]
    if template is None:
        return "\n".join(turn["content"] for turn in turns)
    try:
        return _compiled(template.read_text())(messages=turns, add_generation_prompt=True)
    except (ConfigError, OSError, *render_errors()) as e:
        raise PodiumError(f"the chat template of this model ({template}) does not render the conversation: {e}") from e
