"""Custom prompts saved from Podium: appended, one version per save, every version holding the ones before it."""

import threading

import pytest

from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.prompts import read_prompts, save_prompt
from factory.errors import ConfigError


def test_saved_prompts_are_versions_an_eval_can_pin(tmp_path):
    catalog = open_catalog(CatalogConfig.local(tmp_path / "iceberg"))
    assert save_prompt(catalog, "def f(x):\n    return", "the model stops early", "sft.samples@v1#3/prompt") == "v1"
    saved: dict[str, str] = {}

    def save(i: int) -> None:
        saved[f"prompt {i}"] = save_prompt(open_catalog(CatalogConfig.local(tmp_path / "iceberg")), f"prompt {i}", f"note {i}")

    threads = [threading.Thread(target=save, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(saved) == 4
    versions = {tag: {p["prompt"] for p in read_prompts(catalog, tag)} for tag in {"v1", *saved.values()}}
    for prompt, tag in saved.items():
        assert prompt in versions[tag], "the version a save names holds its prompt"
    ordered = sorted(versions, key=lambda t: int(t[1:]))
    for older, newer in zip(ordered, ordered[1:]):
        assert versions[older] < versions[newer], f"{newer} holds everything {older} does"
    assert len(versions[ordered[-1]]) == 5, "no save is lost"
    assert [p["note"] for p in read_prompts(catalog, "v1")] == ["the model stops early"]
    with pytest.raises(ConfigError, match="empty"):
        save_prompt(catalog, "  ", "note")
