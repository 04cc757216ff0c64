"""The concurrency pools stages take slots of, and their limits on an embedded instance (a leaf: the settings read it)."""

TRAINING_POOL = "training"
"""The concurrency pool every stage with checkpoints takes a slot of: the instance's limit says how many train at once."""
EVALUATION_POOL = "evaluation"
"""The concurrency pool of evaluation runs."""
POOL_LIMITS = {TRAINING_POOL: 1, EVALUATION_POOL: 2}
"""Slots per pool on an embedded (laptop) instance: one training stage at a time, two evaluations."""
