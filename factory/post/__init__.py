"""Post-training: sandboxed code execution (and, to come, code-execution data, SFT and RL)."""
