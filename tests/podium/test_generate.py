"""Completions from registry checkpoints, and the links Dagster's metadata carries into Podium."""

import json

import pytest

from factory.config.sft_data import DEFAULT_CHAT_TEMPLATES
from factory.podium.conversation import rendered, sampled, turns_in
from factory.podium.errors import NotFound, PodiumError
from factory.podium.generate import Generator, candidates
from factory.podium.links import checkpoint_url, table_links, table_url
from factory.registry import ArtifactStore


def test_completions_come_from_the_chosen_checkpoint_and_are_repeatable(store):
    registry = ArtifactStore(store / "registry")
    found = candidates(registry)
    assert sorted(c.experiment for c in found) == ["podium-seed1", "podium-seed2"]
    generator = Generator(registry)
    one, two = (generator.find(c.sha256) for c in sorted(found, key=lambda c: c.experiment))
    first = generator.complete(one, "def f(x):\n    return", new_tokens=6)
    assert first.tokens <= 6 and first.candidate == one
    assert generator.complete(one, "def f(x):\n    return", new_tokens=6).text == first.text
    assert generator.complete(two, "def f(x):\n    return", new_tokens=6).text != first.text
    with pytest.raises(NotFound, match="no published checkpoint"):
        generator.find("0" * 64)
    with pytest.raises(PodiumError, match="between 1 and 256"):
        generator.complete(one, "x", new_tokens=1000)


def test_links_point_at_pages(monkeypatch):
    monkeypatch.setenv("FACTORY_PODIUM_URL", "http://podium.internal:9000/")
    assert table_url("raw.stdlib", 42) == "http://podium.internal:9000/t/raw.stdlib?snapshot=42"
    assert checkpoint_url("ab" * 32) == f"http://podium.internal:9000/checkpoint/{'ab' * 32}"
    assert table_links({"stdlib/table": "filtered.stdlib@v2", "stdlib/rows": 10}) == {
        "podium/stdlib": "http://podium.internal:9000/t/filtered.stdlib?snapshot=v2"
    }


def test_a_garbage_manifest_is_skipped_by_the_candidates_with_a_warning(store, tmp_path, caplog):
    import shutil

    shutil.copytree(store / "registry", tmp_path / "registry", symlinks=True)
    (tmp_path / "registry" / "manifests").chmod(0o755)
    (tmp_path / "registry" / "manifests" / "garbage.json").write_text('{"kind": "pretrain", "files": 3}')
    found = candidates(ArtifactStore(tmp_path / "registry"))
    assert sorted(c.experiment for c in found) == ["podium-seed1", "podium-seed2"]
    assert "garbage.json" in caplog.text


def test_a_conversation_prompts_a_model_through_its_chat_template(tmp_path):
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"},
             {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "6"}]
    row = sampled(json.dumps(turns))
    assert row is not None and row.reply == "6" and turns_in(row.prompt) == turns[:4]
    assert sampled("def f(x):\n    return x") is None and sampled('[{"role": "user"}]') is None  # text, and turns without content
    template = tmp_path / "chat_template.jinja"
    template.write_text(DEFAULT_CHAT_TEMPLATES["messages"])
    assert rendered(row.prompt, template).endswith("<|user|>\nAnd 3 + 3?\n<|assistant|>\n")
    assert rendered("hello", template) == "<|user|>\nhello\n<|assistant|>\n"  # text is one user turn
    assert rendered(row.prompt, None) == "Be brief.\n2 + 2?\n4\nAnd 3 + 3?"  # fine-tuned without a template: the turns' text
    template.write_text("{{ messages[0].missing }}")
    with pytest.raises(PodiumError, match="does not render the conversation"):
        rendered("hello", template)
