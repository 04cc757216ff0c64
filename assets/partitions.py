"""Partitions: one per experiment (name from the experiment file); one per saved checkpoint; checkpoint x benchmark."""

from dagster import DynamicPartitionsDefinition, MultiPartitionsDefinition

EXPERIMENTS = "experiments"
# Runs started from git carry the commit whose experiment files they read.
COMMIT_TAG = "factory/commit"
SOURCE_TAG = "factory/source"
experiments_partitions = DynamicPartitionsDefinition(name=EXPERIMENTS)
CHECKPOINTS = "checkpoints"
checkpoints_partitions = DynamicPartitionsDefinition(name=CHECKPOINTS)
BENCHMARKS = "benchmarks"
benchmarks_partitions = DynamicPartitionsDefinition(name=BENCHMARKS)
# Keys read `<benchmark>|<checkpoint>` (dimensions in name order).
evaluations_partitions = MultiPartitionsDefinition({"benchmark": benchmarks_partitions, "checkpoint": checkpoints_partitions})
