"""Where a stage runs. The local launcher starts a process; it knows nothing of training."""

from factory.launch.local import LocalLauncher, stage_argv

__all__ = ["LocalLauncher", "stage_argv"]
