"""Partitions: one per experiment (name from the experiment file); one per saved checkpoint."""

from dagster import DynamicPartitionsDefinition

EXPERIMENTS = "experiments"
# Runs started from git carry the commit whose experiment files they read.
COMMIT_TAG = "factory/commit"
SOURCE_TAG = "factory/source"
experiments_partitions = DynamicPartitionsDefinition(name=EXPERIMENTS)
CHECKPOINTS = "checkpoints"
checkpoints_partitions = DynamicPartitionsDefinition(name=CHECKPOINTS)
