"""Assembles the code location: assets and the resources (embedded defaults; the volcano launcher when $FACTORY_CLUSTER says so)."""

import os

from dagster import Definitions, multiprocess_executor

from assets.checkpoints import checkpoints
from assets.evaluations import evaluations
from assets.benchmark_data import heldout_corpus, humaneval_problems
from assets.leaderboard import automation, best_model, leaderboard
from assets.post import code_exec_tasks
from assets.promote import production_model
from assets.report import run_report
from assets.sensors import experiments_at_head
from assets.stages import stage_assets
from resources import ExperimentFiles, FactoryStores, launcher_from_env

defs = Definitions(
    assets=[*stage_assets, checkpoints, evaluations, leaderboard, best_model, run_report, code_exec_tasks, heldout_corpus, humaneval_problems, production_model],
    sensors=[experiments_at_head, automation],
    # A run the daemon or the UI launches starts each step as a process: forked from a server that imported this code
    # location and opened the instance once (assets/forkserver.py), not a fresh interpreter that imports Dagster, the code
    # location and the instance's storage again (about 2.3 s of CPU a step). The module is named: Dagster's default ("the
    # module the job was loaded from") reads an absent list as an empty one, and its server then preloads Dagster alone.
    executor=multiprocess_executor.configured({"start_method": {"forkserver": {"preload_modules": ["assets.forkserver"]}}}),
    resources={
        "experiments": ExperimentFiles(directory=os.environ.get("FACTORY_EXPERIMENTS", "experiments")),
        "stores": FactoryStores(root=os.environ.get("FACTORY_ROOT", ".factory")),
        "launcher": launcher_from_env(),
    },
)
