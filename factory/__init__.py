"""Model Factory: the library. Config, data, models, training, evals, registry and launchers.

This package never imports `dagster` (only `dagster_pipes`), so a training process stays light
and the core is testable without an orchestrator.
"""

__version__ = "0.1.0"
