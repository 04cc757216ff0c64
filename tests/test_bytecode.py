"""What `make test` imports before the suite, to write its bytecode once (tests/bytecode.py)."""

import importlib.util
from pathlib import Path

from tests import bytecode


def locatable(module: str) -> bool:
    """Whether `module` is there to import, found without importing it (only its top package's location is looked up)."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not rest:
        return spec is not None
    path = Path(next(iter(spec.submodule_search_locations or ["/nonexistent"]))).joinpath(*rest)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_every_module_a_group_names_is_there_to_import():
    """A module renamed or moved by an upgrade would be named on stderr at each install and its bytecode left to the suite."""
    missing = [module for group in bytecode.GROUPS for module in bytecode.group_modules(group) if not locatable(module)]
    assert missing == []


def test_a_module_that_does_not_import_is_named_and_the_others_still_import(monkeypatch, capsys):
    monkeypatch.setitem(bytecode.GROUPS, "tried", ("json", "no_such_module_of_the_factory", "csv"))
    assert bytecode.import_group("tried") == 2
    said = capsys.readouterr().err
    assert "bytecode: no_such_module_of_the_factory did not import (ModuleNotFoundError:" in said and "json" not in said
