"""Roles the stage kinds declare: the lists and the kinds other modules need are derived from the registry, so a plugin
kind can take a role and no module outside a kind's own names it."""

import dataclasses

import pytest

import factory.config.kinds as kinds
import factory.config.stages as stages
from factory.config.kinds import (
    BLEND, TOKENIZER, MetricsPlot, StageKind, main_training_kind, model_kind, provider, stage_kind, stage_kinds,
)
from factory.errors import ConfigError

SCRAPED = StageKind(name="scraped", description="web pages", run="scraped:run", writes_tables=True, reads_sources=True,
                    group="data")
"""A plugin data stage: it reads files from outside the registry and writes table versions."""
BUNDLE = StageKind(name="bundle", description="an exported bundle", run="bundle:run", reads=("pretrain",), exports_model=True)
"""A plugin kind that takes the exported model's role (from a registry whose `model` kind gave it up)."""


@pytest.fixture
def registered(monkeypatch):
    """Register extra kinds (and take roles off built-in ones) as the plugin loader would, for this test only."""
    def register(*extra: StageKind, without: tuple[str, ...] = ()) -> None:
        builtin = tuple(dataclasses.replace(k, exports_model=False) if k.name in without else k for k in kinds.registered_kinds())
        registry = (*builtin, *extra)
        monkeypatch.setattr(kinds, "registered_kinds", lambda: registry)

    return register


def test_the_built_in_kinds_hold_the_roles_the_factory_reads():
    assert model_kind().name == "model"
    assert main_training_kind().name == "pretrain"
    assert (provider(BLEND).name, provider(TOKENIZER).name) == ("blend", "tokenizer")
    assert stages.DATA_STAGES == ("raw_datasets", "deduped_datasets", "filtered_datasets")
    assert [k.name for k in stage_kinds() if k.reads_sources] == ["raw_datasets"]
    assert [k.name for k in stage_kinds() if k.dataset_checks] == ["filtered_datasets"]
    assert [k.metrics_plot().file for k in stage_kinds() if k.checkpoints] == ["training.png", "sft.png", "rl.png"]


def test_the_derived_lists_and_role_holders_come_from_the_registry(registered):
    registered(SCRAPED, BUNDLE, without=("model",))
    assert stages.DATA_STAGES == ("raw_datasets", "deduped_datasets", "filtered_datasets", "scraped")
    assert model_kind() is BUNDLE
    assert stage_kind("scraped").reads_sources


def test_a_role_no_kind_holds_is_a_config_error_naming_the_kinds(registered):
    registered(without=("model",))
    with pytest.raises(ConfigError, match="no registered stage kind exports the model \\(kinds: raw_datasets, "):
        model_kind()


def test_a_kind_with_checkpoints_is_plotted_under_its_name_unless_it_says_how():
    average = StageKind(name="average", description="", run="average:run", checkpoints=True)
    assert average.metrics_plot() == MetricsPlot(title="average", file="average.png", alt="average loss")
    told = MetricsPlot(title="Averaged", file="avg.png", alt="averaged loss")
    assert dataclasses.replace(average, plot=told).metrics_plot() is told
    assert dataclasses.replace(average, checkpoints=False).metrics_plot() is None

