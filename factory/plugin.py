"""The public plugin API: everything a package that extends the factory may use, in one module.

A plugin package declares stage kinds (`model_factory.stages`), source kinds (`model_factory.sources`), architectures
(`model_factory.models`) and benchmarks (`model_factory.benchmarks`) through entry points, and imports the factory only
from here: the rest of `factory` is private and may change between releases (an import-linter contract keeps the shipped
plugins in `examples/` on this surface). `docs/plugins.md` walks through writing each of them.

Light to import, as reading the registry imports every plugin: what needs torch or pyiceberg is imported by the
functions that use it, when a stage runs.
"""

from __future__ import annotations

from factory.config.architectures import ModelArch
from factory.config.data_sections import SourceConfig
from factory.config.kinds import MetricsPlot, Placement, StageKind, TableNeed, as_resources_say, one_rank
from factory.config.schema import Experiment, TrainedModel
from factory.config.section import GrownSection, Section
from factory.config.source_cache import source_cache
from factory.config.source_kinds import DataPath, SourceKind
from factory.errors import ConfigError, PluginError, StageFailed
from factory.evals.base import Benchmark, EvalInputs, Score
from factory.runtime.context import StageContext

__all__ = [
    "Benchmark", "ConfigError", "DataPath", "EvalInputs", "Experiment", "GrownSection", "MetricsPlot", "ModelArch", "Placement",
    "PluginError", "Score", "Section", "SourceConfig", "SourceKind", "StageContext", "StageFailed", "StageKind", "TableNeed",
    "TrainedModel", "as_resources_say", "one_rank", "source_cache",
]
