"""What the forkserver of a run's multiprocess executor imports before it forks a step (the executor's preload, named
in assets/definitions.py): the code location, and everything a step imports to open the instance from its ref.

A step opens the instance first. Dagster imports the instance's storage, alembic, and the run launcher's and
coordinator's modules lazily, so each step used to import them itself: about a second of CPU a step here, a third of
the CPU of the daemon's runs in tests/e2e/test_daemon.py (profiled with py-spy). Opening the instance here imports
them once per run, for whichever storage the instance has (sqlite or PostgreSQL). It is closed before the server forks
its first step, so no step inherits a connection.
"""

import os

from dagster import DagsterInstance

import assets.definitions  # noqa: F401  (the code location, which every step loads)

if os.environ.get("DAGSTER_HOME"):
    with DagsterInstance.get() as instance:
        instance.get_runs(limit=1)
