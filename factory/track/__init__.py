"""Experiment tracking: MLflow (default, sqlite under the factory root), self-hosted Neptune, or none.

Importing this package imports no tracking library; `open_run` loads the chosen backend.
"""

from factory.track.base import NullRun, TrackerRun, TrackingConfig, flatten, open_run

__all__ = ["NullRun", "TrackerRun", "TrackingConfig", "flatten", "open_run"]
