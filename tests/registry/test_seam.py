"""The registry's seam (`factory.registry.seam.Registry`): both registries, the local one and the one over an object store,
offer every member of it with the same parameters, so whatever reads or writes artifacts through it works on either."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from factory.registry import ArtifactStore, Records, Registry, open_registry
from factory.registry.objects import ObjectRegistry
from factory.registry.seam import Registry as SeamRegistry
from factory.storage import open_store

IMPLEMENTATIONS = (ArtifactStore, ObjectRegistry)
MEMBERS = sorted(name for name, value in vars(SeamRegistry).items() if inspect.isfunction(value) and not name.startswith("_"))


def parameters(function) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]


def test_the_seam_names_what_callers_use_of_a_registry():
    assert {"lookup", "publish", "open", "read", "fetch", "manifests", "lease", "history", "verify", "staging", "work"} <= set(MEMBERS)
    assert set(SeamRegistry.__annotations__) == {"root", "location"}


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_each_registry_offers_every_member_of_the_seam_with_its_parameters(implementation):
    missing = [member for member in MEMBERS if not callable(getattr(implementation, member, None))]
    assert not missing, f"{implementation.__name__} lacks {missing}"
    differ = {member: (parameters(getattr(implementation, member)), parameters(getattr(SeamRegistry, member))) for member in MEMBERS
              if parameters(getattr(implementation, member)) != parameters(getattr(SeamRegistry, member))}
    assert not differ, differ


def test_both_registries_take_the_seams_defaults():
    for member in MEMBERS:
        seam = [p.default for p in inspect.signature(getattr(SeamRegistry, member)).parameters.values()]
        for implementation in IMPLEMENTATIONS:
            given = [p.default for p in inspect.signature(getattr(implementation, member)).parameters.values()]
            assert [mine if theirs is ... else theirs for mine, theirs in zip(given, seam)] == given, (implementation.__name__, member)


def test_open_registry_gives_a_registry_on_disk_and_on_a_store(tmp_path, monkeypatch):
    monkeypatch.delenv("FACTORY_STORE", raising=False)
    for registry in (open_registry(tmp_path / "registry"), ObjectRegistry(open_store(tmp_path / "store"), tmp_path / "local")):
        assert isinstance(registry, Registry)
        assert isinstance(registry.history("promotions/production"), Records)
        assert registry.root.is_absolute() and registry.location
    assert Registry is SeamRegistry


def test_the_import_contract_of_the_seam_covers_every_package_of_the_factory_but_the_registry():
    import tomllib

    repo = Path(__file__).resolve().parents[2]
    linter = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts, roots = linter["contracts"], linter["root_packages"]
    [seam] = [c for c in contracts if "factory.registry.objects" in c.get("forbidden_modules", [])]
    every = {f"factory.{p.stem if p.is_file() else p.name}" for p in (repo / "factory").iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert set(seam["source_modules"]) == (every - {"factory.registry"}) | (set(roots) - {"factory"})
