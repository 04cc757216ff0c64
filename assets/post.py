"""Post-training data: the code-execution task set, generated and executed in the sandbox, as an Iceberg table."""

from collections import Counter

from dagster import AssetExecutionContext, Config, DataVersion, MaterializeResult, MetadataValue, asset

from factory.data.catalog import open_catalog
from factory.data.tables import write_version
from factory.post.tasks import TASK_SCHEMA, generate
from resources import FactoryStores

TABLE = "post.code_exec_tasks"


class TaskSetConfig(Config):
    functions: int = 2000
    """Distinct generated functions."""
    calls_per_function: int = 3
    seed: int = 0


@asset(
    description="Code-execution tasks (function, call, expected output from executing it in the sandbox), split by function hash.",
    kinds={"iceberg"},
    group_name="post",
)
def code_exec_tasks(context: AssetExecutionContext, config: TaskSetConfig, stores: FactoryStores) -> MaterializeResult:
    tasks = generate(config.functions, config.calls_per_function, config.seed)
    version = write_version(open_catalog(stores.catalog()), TABLE, tasks.rows, context.log, schema=TASK_SCHEMA)
    rows = tasks.rows.to_pylist()
    return MaterializeResult(
        metadata={
            "table": version.ref, "snapshot_id": version.snapshot_id, "rows": version.rows, "dropped_calls": tasks.dropped,
            "splits": MetadataValue.json(dict(Counter(r["split"] for r in rows))),
            "difficulty": MetadataValue.json(dict(Counter(r["difficulty"] for r in rows))),
            "families": MetadataValue.json(dict(Counter(r["family"] for r in rows))),
        },
        data_version=DataVersion(version.content_tag),
    )
