"""The Dagster layer: asset definitions over the factory library. `definitions.py` only assembles."""
