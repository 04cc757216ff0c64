"""Partitions: one per experiment (name from the experiment file); one per saved checkpoint; checkpoint x benchmark."""

from dagster import DynamicPartitionsDefinition, MultiPartitionsDefinition

EXPERIMENTS = "experiments"
# Runs started from git carry the commit whose experiment files they read.
COMMIT_TAG = "factory/commit"
SOURCE_TAG = "factory/source"
FILE_TAG = "factory/file"  # the file's path in the repository
MERGE_TAG = "factory/merge-commit"  # the commit that brought the file onto the branch (a pull request's merge)
FILE_URL_TAG = "factory/file-url"  # the file at that commit on the forge, when the remote is an http(s) URL
# A run of an experiment that starts from a model made elsewhere carries what its `from` resolved to when it was planned,
# so that every stage of the run starts from that model, wherever an alias moves meanwhile.
FROM_TAG = "factory/from"
FROM_DIGEST_TAG = "factory/from-digest"
experiments_partitions = DynamicPartitionsDefinition(name=EXPERIMENTS)
CHECKPOINTS = "checkpoints"
checkpoints_partitions = DynamicPartitionsDefinition(name=CHECKPOINTS)
BENCHMARKS = "benchmarks"
benchmarks_partitions = DynamicPartitionsDefinition(name=BENCHMARKS)
# Keys read `<benchmark>|<checkpoint>` (dimensions in name order).
evaluations_partitions = MultiPartitionsDefinition({"benchmark": benchmarks_partitions, "checkpoint": checkpoints_partitions})


def evaluation_key(benchmark: str, checkpoint: str) -> str:
    """The `evaluations` partition of `checkpoint` on `benchmark`: `str(MultiPartitionKey(...))` of the two, made as a plain
    string (Dagster's own object takes as long as the rest of a backfill's planning does per pair, over 10,000 pairs)."""
    return "|".join((benchmark, checkpoint))  # Dagster's own join: anything but two strs is refused, as it refuses it
