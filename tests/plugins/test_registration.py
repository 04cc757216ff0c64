"""A stage kind that cannot be registered is a clear error at load time (`factory check` exits 2), never a traceback."""

import pytest

from tests.plugins.conftest import REPO, fake_package, factory_with

TINY = str(REPO / "experiments" / "tiny-code-lm.md")
KIND = """\
from factory.config.kinds import StageKind
from factory.config.section import Section


class Config(Section):
    \"\"\"Its knobs.\"\"\"

    size: int = 1
    \"\"\"How big.\"\"\"


KIND = StageKind(name={name!r}, description="a test kind", run="{module}:run", reads={reads!r}, config=Config, section={section!r})
"""


@pytest.mark.parametrize(("name", "reads", "section", "said"), [
    ("pretrain", ("blend",), "extra", "declares the stage kind 'pretrain', which built in declares already; rename one of them"),
    ("shrink", ("pretrian",), "shrink", "stage kind 'shrink' reads 'pretrian', which no stage kind declares"),
    ("shrink", ("pretrain",), "model", "section 'model' of stage kind 'shrink' is a built-in section of the experiment file"),
    ("evaluation", (), "extra", "declares the stage kind 'evaluation', which built in declares already; rename one of them"),
])
def test_a_kind_that_clashes_or_reads_an_unknown_kind_is_refused_naming_the_plugin(tmp_path, name, reads, section, said):
    site = fake_package(tmp_path, "clash_plugin", KIND.format(name=name, module="clash_plugin", reads=reads, section=section),
                        {name: "clash_plugin:KIND"})
    result = factory_with(site, "check", TINY)
    assert result.returncode == 2
    assert f"error: plugin {name!r} (clash_plugin:KIND of package clash-plugin)" in result.stderr and said in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_kind_with_checkpoints_that_does_not_read_the_blend_and_tokenizer_is_refused(tmp_path):
    module = ("from factory.plugin import StageKind, TrainedModel\n"
              "class Settings(TrainedModel):\n    pass\n"
              "KIND = StageKind(name='blind', description='no held-out data', run='x:run', reads=('pretrain',), checkpoints=True, "
              "settings=Settings)\n")
    site = fake_package(tmp_path, "blind_plugin", module, {"blind": "blind_plugin:KIND"})
    result = factory_with(site, "check", TINY)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert ("plugin 'blind' (blind_plugin:KIND of package blind-plugin): a kind with checkpoints reads the blend and the tokenizer "
            "(`reads`)") in result.stderr, result.stderr


def test_a_plugin_that_fails_to_import_is_named_with_its_error(tmp_path):
    site = fake_package(tmp_path, "broken_plugin", "import no_such_module\n", {"broken": "broken_plugin:KIND"})
    result = factory_with(site, "check", TINY)
    assert result.returncode == 2
    assert ("plugin 'broken' (broken_plugin:KIND of package broken-plugin) failed to import (ModuleNotFoundError: No module "
            "named 'no_such_module'); fix the package or uninstall it") in result.stderr
    assert "Traceback" not in result.stderr


def test_an_entry_point_that_names_something_else_or_another_kind_is_refused(tmp_path):
    module = KIND.format(name="shrink", module="odd_plugin", reads=("pretrain",), section="shrink") + "NOT_A_KIND = 3\n"
    site = fake_package(tmp_path, "odd_plugin", module, {"other": "odd_plugin:KIND", "shrink": "odd_plugin:NOT_A_KIND"})
    result = factory_with(site, "check", TINY)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "plugin 'other' (odd_plugin:KIND of package odd-plugin) declares the stage kind 'shrink': name the entry point" in result.stderr


def test_two_plugins_declaring_one_kind_are_refused(tmp_path):
    for package in ("one_plugin", "two_plugin"):
        fake_package(tmp_path, package, KIND.format(name="shrink", module=package, reads=("pretrain",), section=None),
                     {"shrink": f"{package}:KIND"})
    result = factory_with(tmp_path, "check", TINY)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "declares the stage kind 'shrink', which plugin 'shrink' (" in result.stderr


def test_two_plugins_without_sections_of_their_own_both_register(tmp_path):
    """Kinds without a section (fingerprinted on the seed alone) do not clash over having none."""
    for package, name in (("one_plugin", "shrink"), ("two_plugin", "grow")):
        module = KIND.format(name=name, module=package, reads=("pretrain",), section=None).replace(", config=Config", "")
        fake_package(tmp_path, package, module, {name: f"{package}:KIND"})
    result = factory_with(tmp_path, "check", TINY)
    assert result.returncode == 0, result.stderr


def test_a_plugin_kind_outside_an_experiments_chain_is_refused(tmp_path):
    module = KIND.format(name="score", module="batch_plugin", reads=("pretrain",), section="score").replace(
        "section='score')", "section='score', scope='checkpoints')")
    site = fake_package(tmp_path, "batch_plugin", module, {"score": "batch_plugin:KIND"})
    result = factory_with(site, "check", TINY)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "plugin 'score' (batch_plugin:KIND of package batch-plugin): a plugin kind is a stage of an experiment" in result.stderr


@pytest.mark.parametrize(("role", "said"), [
    ("exports_model=True", "stage kind 'shrink' exports the model, as 'model' (built in) does already"),
    ("provides='tokenizer'", "stage kind 'shrink' provides the tokenizer, as 'tokenizer' (built in) does already"),
])
def test_a_plugin_that_claims_a_role_one_kind_holds_is_refused(tmp_path, role, said):
    module = KIND.format(name="shrink", module="role_plugin", reads=("pretrain",), section="shrink").replace(
        "section='shrink')", f"section='shrink', {role})")
    site = fake_package(tmp_path, "role_plugin", module, {"shrink": "role_plugin:KIND"})
    result = factory_with(site, "check", TINY)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "plugin 'shrink' (role_plugin:KIND of package role-plugin)" in result.stderr and said in result.stderr, result.stderr
