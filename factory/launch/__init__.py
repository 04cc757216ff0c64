"""Where a stage runs. The local launcher starts a process (or forks it from a warm interpreter); it knows nothing of training."""

from factory.launch.local import LocalLauncher, stage_argv, warm_starts

__all__ = ["LocalLauncher", "stage_argv", "warm_starts"]
