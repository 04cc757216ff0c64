"""The built-in stage kinds (`builtin.py`: each a `factory.config.kinds.StageKind`) and their runners (`datasets.py`,
`runners.py`, `post.py`), with the evaluation kind (`evaluation.py`, its scoring in `scoring.py`) and the dataset checks."""
