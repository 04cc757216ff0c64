"""Rows rendered by a chat template into segments: the loss counts the assistant turns, and a template that rewrites
earlier text or a row that is not a conversation is refused naming the row."""

import json

import pytest

from factory.config.sft_data import SFTData
from factory.errors import ConfigError
from factory.post.chat import compile_template, conversation, segments

CHAT = [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "3 + 3?"},
        {"role": "assistant", "content": "6"}]


def test_messages_render_into_context_and_assistant_segments():
    data = SFTData(table="sft.chat@v1", format="messages")
    turns = conversation({"messages": json.dumps(CHAT)}, data, "row 0")  # a JSON string of records reads as the records
    assert segments(compile_template(data.template), turns, "row 0") == [
        ("<|user|>\n2 + 2?\n<|assistant|>\n", False), ("4\n", True), ("<|user|>\n3 + 3?\n<|assistant|>\n", False), ("6\n", True),
    ]


def test_a_prompt_completion_row_is_its_prompt_then_its_completion_by_default():
    data = SFTData(table="sft.pairs@v1", prompt="q", completion="a")
    turns = conversation({"q": "assert f(1) ==", "a": " 2\n"}, data, "row 0")
    assert segments(compile_template(data.template), turns, "row 0") == [("assert f(1) ==", False), (" 2\n", True)]


def test_a_template_that_rewrites_earlier_turns_is_refused():
    render = compile_template("{{ messages | length }}{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(ConfigError, match="renders row 3 so that the text before assistant turn 1 changes"):
        segments(render, CHAT, "row 3")


@pytest.mark.parametrize("value, wanted", [
    ("not json", "is not JSON"), ([{"role": "user"}], "list of {role, content} records"),
    ([{"role": "user", "content": "hi"}], "no 'assistant' turn"),
])
def test_a_row_that_is_no_conversation_is_named(value, wanted):
    with pytest.raises(ConfigError, match=f"row 7: .*{wanted}"):
        conversation({"messages": value}, SFTData(table="sft.chat@v1", format="messages"), "row 7")


def test_data_and_a_task_table_together_are_refused():
    from factory.config.schema import SFTConfig

    with pytest.raises(ValueError, match="either 'tasks'"):
        SFTConfig(steps=2, tasks="post.other@v1", data={"table": "sft.chat@v1"})
