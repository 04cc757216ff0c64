"""Stage runners run for real through `python -m factory.runtime`: what their materializations say."""

import inspect
import json
import textwrap

import pytest

from tests.stages.conftest import run_stages

pytestmark = pytest.mark.usefixtures("no_pipes")
SOURCES = {f"{module.__name__}.py": inspect.getsource(module) for module in (json.encoder, json.decoder, textwrap)}


def last_materialization(out: str) -> dict:
    """The metadata of the last materialization the console reporter printed."""
    return json.loads(out[out.rindex('{\n  "data_version"') :])["metadata"]


def test_a_vocabulary_smaller_than_vocab_size_is_a_warning_that_says_what_to_change(tmp_path, tiny_path, capsys):
    run_stages(tmp_path, tiny_path, SOURCES, "src", "tokenizer", tokenizer={"vocab_size": 200_000})
    out, err = capsys.readouterr()
    metadata = last_materialization(out)
    learned = metadata["summary/vocab_size"]
    assert learned < 200_000
    warning = metadata["summary/warnings"]
    assert f"learned {learned:,} of the 200,000 tokens" in warning and f"lower tokenizer.vocab_size to about {learned:,}" in warning
    assert f"tokenizer: {warning}" in err

    run_stages(tmp_path, tiny_path, SOURCES, "src", "tokenizer", tokenizer={"vocab_size": 200_000})  # from the cache: warned again
    out, err = capsys.readouterr()
    assert last_materialization(out)["cache"] == "hit" and f"tokenizer: {warning}" in err

    run_stages(tmp_path, tiny_path, SOURCES, "src", "tokenizer", tokenizer={"vocab_size": 300})
    metadata = last_materialization(capsys.readouterr().out)
    assert metadata["summary/vocab_size"] == 300 and "summary/warnings" not in metadata
