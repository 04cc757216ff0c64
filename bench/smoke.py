"""The tiny experiment at a size that runs in seconds, for the benches that run a whole experiment (`--smoke`).

The same stages as experiments/tiny-code-lm.md on a few files and a few steps, scored on the benchmarks that read the
catalog (`heldout_bpb`, its own table; `val_bpb`, the blend's split) but not on `next_line` (seconds of generation, and
nothing a bench treats apart). The test suite runs every bench this way (tests/bench/test_smoke.py) so that none stops
working unnoticed; its figures mean little.
"""

from pathlib import Path

TINY = Path(__file__).resolve().parents[1] / "experiments" / "tiny-code-lm.md"
SMOKE = """---
extends: {tiny}
data:
  datasets:
    stdlib:
      source: {{include: ["json/**/*.py"]}}
    site_packages:
      source: {{include: ["yaml/**/*.py"]}}
  validation_percent: 20
tokenizer: {{vocab_size: 320, sample_bytes: 100000}}
model: {{n_layer: 1, n_embd: 32, context: 64}}
pretrain: {{steps: 4, batch_size: 2, warmup_steps: 1, checkpoint_every: 0, log_every: 1}}
eval: {{benchmarks: [heldout_bpb, val_bpb], max_bytes: 3000}}
---
{tiny_name} at a size that runs in seconds (bench/smoke.py).
"""


def write_smoke_experiment(directory: Path) -> Path:
    """The small variant of the tiny experiment, as an experiment file in `directory`."""
    path = directory / "tiny-smoke.md"
    path.write_text(SMOKE.format(tiny=TINY, tiny_name=TINY.stem))
    return path
