"""What operators do with what the stages made, without running a stage: plan (what would run, and why), diff (two
experiments, stage by stage), lineage (what made an artifact, and what was made from it), reproduce (compute a model
again and compare the bytes), promote (move an alias, gated), and batch (the exact sequences a training step read)."""
