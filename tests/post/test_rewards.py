"""Rewards: executing the answer's assertion in the sandbox, plus a small reward for a well-formed answer."""

import pytest

from factory.post.rewards import rewards
from factory.post.sandbox import Limits, Sandbox

TASK = {"function": "def f(x):\n    return [x * 2, str(x)]\n", "call": "f(3)"}


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(Limits(cpu_s=1, wall_s=3, memory_mb=128), workers=2)


@pytest.mark.parametrize(("text", "value", "passed", "formatted"), [
    (" [6, '3']\n", 1.1, True, True),
    (' [6, "3"]\nmore', 1.1, True, True),  # quotes do not matter: the values are compared
    (" [6, 3]\n", 0.1, False, True),  # well formed, wrong
    (" [6, '3']", 1.0, True, False),  # right, but the line never ended
    (" f(3)\n", 0.0, False, False),  # a call passes its own assertion: not an answer
    (" [6, '3'] or __import__('os').system('true')\n", 0.0, False, False),
    (" [6, '3']  # the list\n", 1.1, True, True),  # a comment is not part of the value
    (" [6.0, '3']\n", 0.1, False, True),  # equal under ==, but not the value the call returns
    (" [6, '3']) or (True\n", 0.0, False, False),  # no way out of the literal
    ("\n", 0.0, False, False),
    (" [6,\n", 0.0, False, False),
])
def test_rewards(sandbox, text, value, passed, formatted):
    [reward] = rewards([TASK], [text], sandbox, format_reward=0.1)
    assert (reward.value, reward.passed, reward.formatted) == (pytest.approx(value), passed, formatted)


def test_a_function_that_fails_earns_nothing(sandbox):
    task = {"function": "def f(x):\n    while True:\n        pass\n", "call": "f(1)"}
    [reward] = rewards([task], [" 1\n"], Sandbox(Limits(cpu_s=1, wall_s=1, memory_mb=128)), format_reward=0.1)
    assert not reward.passed and reward.value == pytest.approx(0.1)
