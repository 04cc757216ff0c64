"""Experiment files: Markdown + YAML front matter -> frozen typed spec, split into fingerprinted stages."""

from factory.config.loader import load, load_file, load_text, pick_variant
from factory.config.schema import Experiment
from factory.config.stages import DATASET_STAGES, STAGES, UPSTREAM, StageSpec, config_hash, plan_stage, upstream_of

__all__ = [
    "DATASET_STAGES", "STAGES", "UPSTREAM", "Experiment", "StageSpec", "config_hash", "load", "load_file", "load_text", "pick_variant", "plan_stage",
    "upstream_of",
]
