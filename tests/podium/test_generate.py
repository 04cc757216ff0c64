"""Completions from registry checkpoints, and the links Dagster's metadata carries into Podium."""

import json

import pytest
import torch

from factory.config.sft_data import DEFAULT_CHAT_TEMPLATES
from factory.podium.conversation import rendered, sampled, turns_in
from factory.podium.errors import NotFound, PodiumError
from factory.podium.generate import Generator, candidates, find_candidate
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


def test_a_model_is_listed_once_with_its_date_and_the_digest_the_cli_prints(store, tmp_path):
    import shutil

    from factory.podium.app import create_app
    from factory.registry import Provenance
    from starlette.testclient import TestClient

    shutil.copytree(store, tmp_path / "root", symlinks=True)
    registry = ArtifactStore(tmp_path / "root" / "registry")
    trained = {m.experiment: m for m in registry.manifests("pretrain")}
    source = registry.path(trained["podium-seed1"].digest)
    with registry.staging() as out:  # the model stage exports seed1's final checkpoint (step 10)
        torch.save(torch.load(source / "step_000010.pt", weights_only=True)["model"], out / "model.pt")  # the weights alone
        (out / "config.json").write_text(json.dumps({"model": trained["podium-seed1"].config["model"], "steps": 10}))
        shutil.copyfile(registry.path(trained["podium-seed1"].inputs["tokenizer"]) / "tokenizer.json", out / "tokenizer.json")
        model = registry.publish(out, kind="model", fingerprint="podium-model-1", config={}, inputs={"pretrain": trained["podium-seed1"].digest},
                                 code="test", provenance=Provenance(experiment="podium-seed1", config_hash="0" * 12, git_commit="0" * 40),
                                 summary={})
    found = candidates(registry)
    assert sorted((c.experiment, c.exported) for c in found) == [("podium-seed1", True), ("podium-seed2", False)]  # not seed1's step 10 too
    seed1, seed2 = sorted(found, key=lambda c: c.experiment)
    assert seed1.label == f"podium-seed1 · model {model.digest[:12]}" and seed1.made == model.created[:16].replace("T", " ")
    assert seed2.label == f"podium-seed2 · pretrain step 10 of pretrain {trained['podium-seed2'].digest[:12]}"
    client = TestClient(create_app(tmp_path / "root"), base_url="http://127.0.0.1:8765")
    page = client.get("/generate")
    assert page.status_code == 200 and page.text.count("podium-seed1 ·") == 1
    assert model.digest[:12] in page.text and seed1.made in page.text
    step10 = json.loads((source / "step_000010.json").read_text())["sha256"]
    linked = client.get(f"/checkpoint/{step10}")  # the link Dagster's metadata gives that checkpoint still opens it
    assert linked.status_code == 200 and f'value="{step10}" checked' in linked.text


def test_the_page_lists_the_newest_runs_and_a_link_opens_an_older_checkpoint_by_its_sha256(store):
    registry = ArtifactStore(store / "registry")
    every = {c.experiment: c.sha256 for c in candidates(registry, newest=None)}
    assert set(every) == {"podium-seed1", "podium-seed2"}
    [listed] = candidates(registry, newest=1)  # the newest run of the pretrain stage (ties of date: by fingerprint)
    assert listed.experiment == "podium-seed2"
    older = every["podium-seed1"]
    assert find_candidate(registry, older).experiment == "podium-seed1"  # asked of the index by the checkpoint file's sha256
    assert {c.experiment for c in candidates(registry, chosen={older}, newest=1)} == {"podium-seed1", "podium-seed2"}
    assert find_candidate(registry, "0" * 64) is None


def test_on_an_object_store_the_list_fetches_no_checkpoint_and_a_completion_only_what_it_loads(store, s3_server, tmp_path,
                                                                                                 monkeypatch):
    import uuid

    from factory.registry.objects import ObjectRegistry
    from factory.storage import open_store
    from tests.podium.conftest import publish_checkpoints, samples

    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    registry = ObjectRegistry(open_store(f"s3://{s3_server.bucket}/{uuid.uuid4().hex[:12]}"), tmp_path / "local")
    publish_checkpoints(registry, [r["prompt"] + r["completion"] for r in samples()[4:]])  # as the local store's fixture
    cache = tmp_path / "local" / "cache"

    def fetched() -> set[str]:
        return {p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file()} if cache.is_dir() else set()

    seed2 = next(m for m in registry.manifests("pretrain") if m.experiment == "podium-seed2")
    record = f"objects/{seed2.digest}/step_000010.json"
    kept = registry.store.get(record, limit=1 << 20).data
    registry.store.delete(record)  # unreadable for a moment: that run is not listed, and its record is read again next time
    assert {c.experiment for c in candidates(registry)} == {"podium-seed1"}
    registry.store.put(record, kept)
    found = {c.experiment: c for c in candidates(registry)}
    assert set(found) == {"podium-seed1", "podium-seed2"}
    assert fetched() == set()  # the list read the records, and copied nothing here
    here = {c.experiment: c for c in candidates(ArtifactStore(store / "registry"))}
    assert {name: c.sha256 for name, c in found.items()} == {name: c.sha256 for name, c in here.items()}

    completion = Generator(registry).complete(found["podium-seed1"], "def f(x):\n    return", new_tokens=6)
    weights, tokenizer = found["podium-seed1"].weights, found["podium-seed1"].tokenizer
    assert fetched() == {f"parts/{weights.artifact.digest}/step_000010.pt", f"parts/{tokenizer}/tokenizer.json"}
    assert completion.text == Generator(ArtifactStore(store / "registry")).complete(here["podium-seed1"], "def f(x):\n    return",
                                                                                  new_tokens=6).text
