"""The built-in stage kinds, in the order they run: each declared in a module of its own, as a plugin declares one.

Every kind's module (`datasets.py` for the raw, deduped and filtered datasets, `blend.py`, `tokenizer.py`,
`pretrain.py`, `sft.py`, `rl.py`, `model.py`, and `evaluation.py`, which scores checkpoints in batches outside any
experiment's chain) holds its typed settings (what its fingerprint hashes and its run function
reads, `ctx.settings`), its `StageKind` and its run function. Reading the registry imports them all, so they stay light:
a run function imports its heavy code (torch, pyiceberg) when it runs, and its kind names that code (`imports`) for a
warm interpreter to load once ahead.
"""

from __future__ import annotations

from factory.stages.blend import BLEND
from factory.stages.datasets import DEDUPED_DATASETS, FILTERED_DATASETS, RAW_DATASETS
from factory.stages.evaluation import EVALUATION
from factory.stages.model import MODEL
from factory.stages.pretrain import PRETRAIN
from factory.stages.rl import RL
from factory.stages.sft import SFT
from factory.stages.tokenizer import TOKENIZER

BUILTIN_KINDS = (RAW_DATASETS, DEDUPED_DATASETS, FILTERED_DATASETS, BLEND, TOKENIZER, PRETRAIN, SFT, RL, MODEL, EVALUATION)
