"""Experiment files: Markdown + YAML front matter -> frozen typed spec, split into fingerprinted stages."""

from typing import Any

from factory.config import stages as _stages
from factory.config.loader import load, load_file, load_text, pick_variant
from factory.config.schema import Experiment
from factory.config.stages import StageSpec, config_hash, plan_stage, stages_of, upstream_of

__all__ = [
    "STAGES", "UPSTREAM", "Experiment", "StageSpec", "config_hash", "load", "load_file", "load_text", "pick_variant", "plan_stage",
    "stages_of", "upstream_of",
]


def __getattr__(name: str) -> Any:
    """`STAGES` and `UPSTREAM`, derived from the registered stage kinds when first read."""
    if name in ("STAGES", "UPSTREAM"):
        return getattr(_stages, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
