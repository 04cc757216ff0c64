"""Post-training data: the code-execution task set, generated and executed in the sandbox, as an Iceberg table.

The generator and the catalog are imported when the task set is written or looked for: loading the code location
(the daemon does, and every run process) stays light.
"""

from collections import Counter

from dagster import AssetExecutionContext, AssetMaterialization, Config, DataVersion, MaterializeResult, MetadataValue, asset

from factory.config import Experiment
from factory.podium.links import table_url
from resources import FactoryStores

TABLE = "post.code_exec_tasks"


class TaskSetConfig(Config):
    functions: int = 2000
    """Distinct generated functions."""
    calls_per_function: int = 3
    stdlib_functions: int = 200
    """Pure functions mined from the interpreter's standard library, beside the generated ones."""
    seed: int = 0


def _write_task_set(context: AssetExecutionContext, stores: FactoryStores, config: TaskSetConfig) -> tuple[dict, str]:
    """Generate and write the task set; its materialization metadata (the generator's settings included) and content tag."""
    from factory.data.catalog import open_catalog
    from factory.data.tables import write_version
    from factory.post.tasks import TASK_SCHEMA, generate

    tasks = generate(config.functions, config.calls_per_function, config.seed, stdlib_functions=config.stdlib_functions)
    version = write_version(open_catalog(stores.catalog()), TABLE, tasks.rows, context.log, schema=TASK_SCHEMA)
    rows = tasks.rows.to_pylist()
    metadata = {
        "table": version.ref, "snapshot_id": version.snapshot_id, "podium": MetadataValue.url(table_url(TABLE, version.snapshot_id)), "rows": version.rows, "dropped_calls": tasks.dropped,
        "generator": MetadataValue.json(config.model_dump()),
        "splits": MetadataValue.json(dict(Counter(r["split"] for r in rows))),
        "difficulty": MetadataValue.json(dict(Counter(r["difficulty"] for r in rows))),
        "families": MetadataValue.json(dict(Counter(r["family"] for r in rows))),
    }
    return metadata, version.content_tag


@asset(
    description="Code-execution tasks (function, call, expected output from executing it in the sandbox), split by function hash.",
    kinds={"iceberg"},
    group_name="post",
)
def code_exec_tasks(context: AssetExecutionContext, config: TaskSetConfig, stores: FactoryStores) -> MaterializeResult:
    metadata, content = _write_task_set(context, stores, config)
    return MaterializeResult(metadata=metadata, data_version=DataVersion(content))


def ensure_task_set(context: AssetExecutionContext, stores: FactoryStores, experiment: Experiment) -> None:
    """Generate the default task set when a post-training stage reads it and it was never generated, and report it as a
    materialization of `code_exec_tasks`: a run from git or `factory run` needs no step a person must remember."""
    from factory.data.catalog import open_catalog
    from factory.data.tables import missing_refs, parse_ref

    refs = {section.tasks for section in (experiment.sft, experiment.rl) if section is not None and getattr(section, "data", None) is None}
    ours = sorted(ref for ref in refs if parse_ref(ref)[0] == TABLE)
    if not ours or not missing_refs(open_catalog(stores.catalog()), ours):
        return
    context.log.info(f"{', '.join(ours)} does not exist yet: generating the default task set first")
    metadata, _ = _write_task_set(context, stores, TaskSetConfig())
    context.log_event(AssetMaterialization(asset_key="code_exec_tasks", metadata=metadata))
