"""The built-in stage kinds, one module per kind as a plugin declares one (`datasets.py`: raw, deduped and filtered
datasets; `blend.py`, `tokenizer.py`, `pretrain.py`, `sft.py`, `rl.py`, `model.py`, `evaluation.py`; `builtin.py` lists
them in the order they run), and the code their run functions share, imported when they run (`training.py`,
`versions.py`, `dataset_checks.py`, `scoring.py`; `post_training.py`: what sft and rl declare alike)."""
