"""Dagster resources wrapping factory clients: experiment files, stores, and the stage launcher."""

from resources.experiments import ExperimentFiles
from resources.launcher import StageLauncher
from resources.stores import FactoryStores
from resources.volcano import VolcanoStageLauncher, launcher_from_env

__all__ = ["ExperimentFiles", "FactoryStores", "StageLauncher", "VolcanoStageLauncher", "launcher_from_env"]

