"""Dagster resources wrapping factory clients: experiment files, stores, and the stage launcher."""

from resources.experiments import ExperimentFiles
from resources.launcher import StageLauncher
from resources.stores import FactoryStores

__all__ = ["ExperimentFiles", "FactoryStores", "StageLauncher"]
