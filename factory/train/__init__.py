"""Training: the pretraining loop and its checkpoints."""
