"""Partitions: one per experiment (name from the experiment file)."""

from dagster import DynamicPartitionsDefinition

EXPERIMENTS = "experiments"
experiments_partitions = DynamicPartitionsDefinition(name=EXPERIMENTS)
