"""The experiment file reference: generated from the schema, committed up to date, complete down to nested sections."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field
from pydantic._internal._docs_extraction import extract_docstrings_from_cls

from factory.config import Experiment
from factory.config.reference import build_reference, main
from factory.config.section import Section

PAGE = Path(__file__).resolve().parents[2] / "docs" / "experiment-file.md"


class Knob(Section):
    """A plugin's knob."""

    level: int = Field(3, ge=0, le=9)
    """How far the knob turns."""
    label: str | None = None
    """What the knob is called on the panel."""


class Panel(Section):
    """A plugin section the reference has never heard of."""

    knobs: dict[str, Knob] = {}
    """Knobs by name."""
    spare: tuple[Knob, ...] = ()
    """Knobs in a drawer."""


class Machine(Section):
    """A root that is not an Experiment."""

    panel: Panel | None = None
    """The panel, when there is one."""


def rows(page: str) -> dict[str, list[str]]:
    """Table rows by dotted path: the cells after the path (type, default, bounds, description), pipes unescaped."""
    found = {}
    for line in page.splitlines():
        if line.startswith("| `"):
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            path = cells[0].strip("`")
            assert path not in found, f"{path} has two rows"
            found[path] = cells[1:]
    return found


@functools.cache
def sections_by_name() -> dict[str, type[Section]]:
    """Every section class loaded, by the name pydantic's JSON schema gives it."""
    found, pending = {}, [Section]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.__name__, cls)
        pending += cls.__subclasses__()
    return found


def field_docstring(cls: type, name: str) -> str:
    """The docstring under field `name` in the class of `cls`'s MRO that declares it, read by pydantic's own extractor."""
    for owner in cls.__mro__:
        if name in vars(owner).get("__annotations__", {}):
            return extract_docstrings_from_cls(owner, use_inspect=True).get(name, "")
    return ""


def schema_fields(schema: dict[str, Any], defs: dict[str, Any], path: str = "", cls: type = Experiment) -> Iterator[tuple[str, str]]:
    """(dotted path, expected description) of every field, walked through pydantic's JSON schema, not the reference's walker."""
    classes = sections_by_name()
    for name, prop in schema["properties"].items():
        dotted = f"{path}.{name}" if path else name
        refs = list(refs_in(prop, dotted))
        field = next(n for n, info in cls.model_fields.items() if (info.alias or n) == name)
        description = field_docstring(cls, field) or (defs[refs[0][1]]["description"].split("\n\n")[0] if refs else "")
        yield dotted, " ".join(description.split())
        for nested_path, ref in refs:
            yield from schema_fields(defs[ref], defs, nested_path, classes[ref])


def refs_in(prop: dict[str, Any], path: str) -> Iterator[tuple[str, str]]:
    """The sections a property's schema refers to, with their paths (`<name>` for mapping values, `[i]` for items)."""
    if "$ref" in prop:
        yield path, prop["$ref"].rsplit("/", 1)[1]
    for option in prop.get("anyOf", []) + prop.get("prefixItems", []):
        yield from refs_in(option, path)
    if isinstance(prop.get("items"), dict):
        yield from refs_in(prop["items"], path + "[i]")
    if isinstance(prop.get("additionalProperties"), dict):
        yield from refs_in(prop["additionalProperties"], path + ".<name>")


def test_the_committed_page_is_what_the_schema_generates_now():
    assert PAGE.exists(), f"{PAGE} is missing: run `make docs`"
    assert PAGE.read_text(encoding="utf-8") == build_reference(), (
        f"{PAGE.relative_to(PAGE.parents[1])} is out of date with factory/config/schema.py: "
        "run `make docs` (or `python -m factory.config.reference --write`) and commit the result"
    )


def test_every_field_of_every_reachable_section_is_on_the_page_with_its_docstring():
    schema = Experiment.model_json_schema()
    expected = dict(schema_fields(schema, schema["$defs"]))
    found = rows(build_reference())
    assert {"data.datasets.<name>.dedup.num_perm", "data.blend[i].weight", "control.rules[i].patience.mode"} <= set(expected)
    assert sorted(set(expected) - set(found)) == [], "fields missing from the reference"
    assert sorted(set(found) - set(expected)) == [], "rows that are no field of the schema"
    for path, description in expected.items():
        assert description, f"{path} has no docstring (nor does the section it holds): say what it is for"
        assert found[path][3] == description, path


def test_every_reachable_section_has_a_heading_and_its_docstring():
    page = build_reference()
    for name, definition in Experiment.model_json_schema()["$defs"].items():
        assert f"({name})" in page, name
        assert " ".join(definition["description"].split()) in " ".join(page.split()), name


def test_bounds_types_and_defaults_are_read_from_the_fields():
    found = rows(build_reference())
    assert found["model.n_layer"] == ["`int`", "`4`", "1 ≤ … ≤ 128", "Transformer blocks."]
    assert found["model.dropout"][2] == "0.0 ≤ … < 1.0"
    assert found["data.datasets.<name>.dedup.near_threshold"][:3] == ["`float | null`", "`0.85`", "0 < … ≤ 1"]
    assert found["data.datasets.<name>.filters.min_bytes"][2] == "0 ≤ … ≤ 1099511627776"
    assert found["tokenizer.sample_bytes"][2] == "0 < … ≤ 1099511627776"
    assert found["control.rules[i].do"][1:3] == ["required", "at least 1 item"]
    assert found["model.positions"][:3] == ["`learned | rotary`", "`learned`", ""]
    assert found["data.datasets"][:2] == ["`map of name -> DatasetConfig section`", '`{"stdlib": {}}`']
    assert found["data.datasets.<name>.source.include"][:2] == ["`tuple of str`", '`["**/*.py"]`']
    assert found["pretrain"][:2] == ["`PretrainConfig section | null`", "`null`"]
    assert found["pretrain.betas"][:2] == ["`tuple (float, float)`", "`[0.9, 0.95]`"]
    assert found["rl.lr"][1] == "`0.00002`"  # not 2e-05, which YAML 1.1 reads as a string
    assert found["data"][1] == "`{}`"  # the section's defaults, not what its validator fills in


def test_a_section_the_reference_never_heard_of_appears_with_its_nested_sections():
    page = build_reference(Machine)
    found = rows(page)
    assert list(found) == ["panel", "panel.knobs", "panel.spare", "panel.knobs.<name>.level", "panel.knobs.<name>.label",
                           "panel.spare[i].level", "panel.spare[i].label"]
    assert found["panel.knobs.<name>.level"] == ["`int`", "`3`", "0 ≤ … ≤ 9", "How far the knob turns."]
    assert found["panel.spare"][0] == "`tuple of Knob section`"
    assert "## `panel.knobs.<name>` (Knob)\n\nA plugin's knob." in page
    assert "does not run (`panel`)" in page


@pytest.mark.parametrize("target", [None, "page.md"])
def test_main_prints_or_writes_the_page(tmp_path, capsys, target):
    argv = [] if target is None else ["--write", str(tmp_path / target)]
    assert main(argv) == 0
    written = capsys.readouterr().out if target is None else (tmp_path / target).read_text(encoding="utf-8")
    assert written == build_reference()
