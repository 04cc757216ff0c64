"""Code-execution tasks: seeded, executed for their expected output, split without leakage, stored as an Iceberg table."""

import random
from collections import Counter

from dagster import DagsterInstance, materialize

from assets.post import TABLE, code_exec_tasks
from factory.data.catalog import CatalogConfig, open_catalog
from factory.post.mined import pure_functions
from factory.post.tasks import FAMILIES, generate, programs, split_of
from resources import FactoryStores


def test_the_same_seed_gives_the_same_tasks_and_another_seed_others():
    first, again, other = generate(16, 2, seed=3), generate(16, 2, seed=3), generate(16, 2, seed=4)
    assert first.rows.equals(again.rows)
    assert set(first.rows["id"].to_pylist()) != set(other.rows["id"].to_pylist())


def test_expected_outputs_are_what_running_the_call_prints():
    rows = generate(24, 2, seed=0).rows.to_pylist()
    assert {row["family"] for row in rows} == {family(random.Random(0)).family for family in FAMILIES}
    for row in rows:
        scope: dict = {}
        exec(row["function"], scope)
        assert repr(eval(row["call"], scope)) == row["expected"], row


def test_every_call_of_a_function_is_in_one_split_and_the_splits_are_about_80_10_10():
    rows = generate(80, 3, seed=1).rows.to_pylist()
    by_function: dict[str, set[str]] = {}
    for row in rows:
        by_function.setdefault(row["function"], set()).add(row["split"])
    assert all(len(splits) == 1 for splits in by_function.values())
    shares = Counter(split_of(program.source) for program in programs(800, seed=0))
    total = sum(shares.values())
    assert abs(shares["train"] / total - 0.8) < 0.07 and abs(shares["test"] / total - 0.1) < 0.05, shares


def test_the_families_get_equal_shares_and_calls_are_distinct_in_the_order_drawn():
    families = Counter(program.family for program in programs(80, seed=0))
    assert set(families.values()) == {10}
    rows = generate(16, 3, seed=0).rows.to_pylist()
    calls: dict[str, list[str]] = {}
    for row in rows:
        calls.setdefault(row["function"], []).append(row["call"])
    assert all(len(set(c)) == len(c) for c in calls.values())
    assert any(c != sorted(c) for c in calls.values())  # not the calls that sort first


def test_a_call_that_fails_in_the_sandbox_is_left_out_and_counted():
    from factory.post.sandbox import Limits, Sandbox

    starved = Sandbox(Limits(cpu_s=1, wall_s=3, memory_mb=128, output_bytes=1), workers=2)  # every answer is longer than 1 byte
    tasks = generate(8, 2, seed=0, sandbox=starved)
    assert tasks.rows.num_rows == 0 and tasks.dropped == 16


def test_the_asset_writes_a_versioned_iceberg_table(tmp_path):
    config = {"ops": {"code_exec_tasks": {"config": {"functions": 24, "calls_per_function": 2, "stdlib_functions": 0, "seed": 0}}}}
    run = materialize([code_exec_tasks], instance=DagsterInstance.ephemeral(), resources={"stores": FactoryStores(root=str(tmp_path))},
                      run_config=config)
    assert run.success
    [event] = run.get_asset_materialization_events()
    metadata = {key: value.value for key, value in event.materialization.metadata.items()}
    table = open_catalog(CatalogConfig.local(tmp_path / "iceberg")).load_table(TABLE)
    assert metadata["table"] == f"{TABLE}@v1" and table.scan().to_arrow().num_rows == metadata["rows"] > 0
    again = materialize([code_exec_tasks], instance=DagsterInstance.ephemeral(), resources={"stores": FactoryStores(root=str(tmp_path))},
                        run_config=config)
    [event] = again.get_asset_materialization_events()
    assert event.materialization.metadata["table"].value == f"{TABLE}@v1"  # the same content is the same version


MODULE = '''
import os
LIMIT = 3

def clamp(x, y):
    """Keep x within y."""
    if x > y:
        return y
    return x

def words(s: str) -> list:
    return [w.upper() for w in s.split() if w]

def uses_a_global(x):
    return x + LIMIT

def imports(x):
    import os
    return os.sep + x

def private(x):
    return x.__class__

def generator(x):
    yield x

def no_return(x):
    print(x)

@staticmethod
def decorated(x):
    return x

def defaults(x, y=1):
    return x + y

def recursive(n):
    return 1 if n <= 1 else n * recursive(n - 1)
'''


def test_only_small_functions_that_touch_nothing_but_their_arguments_are_mined():
    found = {f.name: f for f in pure_functions([("mod.py", MODULE)])}
    assert sorted(found) == ["clamp", "recursive", "words"]
    assert found["clamp"].source == "def clamp(x, y):\n    if x > y:\n        return y\n    return x\n"  # docstring dropped
    assert found["words"].source.startswith("def words(s):")  # annotations dropped
    assert found["clamp"].parameters == 2 and found["clamp"].origin == "mod.py"


def test_mined_tasks_are_executed_calls_of_standard_library_functions():
    rows = generate(8, 2, seed=0, stdlib_functions=12).rows.to_pylist()
    mined = [row for row in rows if row["family"] == "stdlib"]
    assert len({row["function"] for row in mined}) >= 6 and all(row["difficulty"] in ("easy", "medium", "hard") for row in mined)
    for row in mined:
        scope: dict = {}
        exec(row["function"], scope)
        assert repr(eval(row["call"], scope)) == row["expected"], row
        assert row["split"] == split_of(row["function"])
    per_function = Counter(row["function"] for row in mined)
    assert max(per_function.values()) <= 2
