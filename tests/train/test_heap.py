"""The allocator setting the trainer makes for its process: what a step frees stays for the next step."""

import ctypes
import json
import resource
import statistics
import subprocess
import sys
from typing import Any

from factory.train import heap

# Eight steps of the bench's model (bench/trainer.py) in a fresh process, after two that warm it up; prints the minor page
# faults of each of the eight (from one batch to the next, the last to the end).
STEPS = """
import logging, resource, sys, tempfile
from pathlib import Path
import torch
from factory.config.schema import ModelConfig, PretrainConfig
from factory.data.loader import Batch, LoaderState
from factory.train.pretrain import pretrain

torch.set_num_threads(1)
model = ModelConfig(n_layer=2, n_head=4, n_embd=128, context=128)
config = PretrainConfig(steps=8, batch_size=16, lr=1e-3, checkpoint_every=0, log_every=10)
generator = torch.Generator().manual_seed(0)
seqs = [torch.randint(0, 2048, (16, 129), generator=generator) for _ in range(8)]

counts = []

def data(state):
    for step, s in enumerate(seqs[state.slot if state else 0:]):
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
        yield Batch(x=s[:, :-1].clone(), y=s[:, 1:].clone(), documents=(), state=LoaderState(slot=step + 1), real_tokens=2048, global_tokens=2048)

with tempfile.TemporaryDirectory() as work:  # first, what any first run does once (lazy imports, compiling their code)
    pretrain(data, 2048, model, config.model_copy(update={"steps": 2}), 0, Path(work), logging.getLogger("steps"))
counts.clear()
with tempfile.TemporaryDirectory() as work:
    pretrain(data, 2048, model, config, 0, Path(work), logging.getLogger("steps"))
counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
print([after - before for before, after in zip(counts, counts[1:])])
"""


PR_SET_THP_DISABLE = 41


def no_huge_pages() -> None:
    """In the child: no transparent huge pages for it (torch asks for them for large buffers, and whether the kernel has
    them to give depends on the machine's memory at that moment: a step's buffers then fault as 2 MiB pages or as 4 KiB
    ones, which made the count without the kept heap anywhere from 17,000 to 90,000)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)


def faults(env: dict[str, str], code: str = STEPS) -> Any:
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env},
                         preexec_fn=no_huge_pages)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)


LOGITS_PAGES = 16 * 128 * 2048 * 4 // resource.getpagesize()
"""The pages of one of a step's largest buffers: the logits of 16 x 128 tokens over 2,048 entries, in fp32."""


def test_the_trainers_steps_no_longer_fault_their_buffers_in_every_time():
    """glibc as it is gives some of a step's buffers back and faults them in again (how many depends on the order of
    its frees: 20,000 to 90,000 pages in the eight steps here); kept, the typical step faults none of them in. A median
    step, so that one step's fault-in of something else (another thread's arena; a loaded machine) does not decide it."""
    default, kept = faults({heap.LEAVE_ENV: "1"}), faults({})
    assert sum(default) > 2 * LOGITS_PAGES, default
    assert statistics.median(kept) < LOGITS_PAGES / 8, (kept, default)


# An evaluation batch's scoring (bits per byte): logits of 32 windows x 128 tokens x 2,048 entries in fp32, 32 MiB and
# torch's alignment, just above the mmap threshold, then their log-softmax, eight times after one warm-up; prints the
# minor page faults the eight took.
SCORING = """
import resource
import torch
from torch.nn import functional as F
from factory.train import heap

heap.keep_freed_memory()
torch.set_num_threads(1)
generator = torch.Generator().manual_seed(0)
x, w = torch.randn(32, 128, 128, generator=generator), torch.randn(128, 2048, generator=generator)
y = torch.randint(0, 2048, (32 * 128,), generator=generator)

def batch():
    return F.cross_entropy((x @ w).reshape(-1, 2048), y, reduction="sum")

batch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):
    batch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_buffers_just_above_the_mmap_threshold_come_from_the_kept_heap():
    """Mapped afresh, each batch faults its two 32 MiB buffers in again (16 x 8,192 pages); from the heap's padded top,
    most are the pages of the batch before."""
    default, kept = faults({heap.LEAVE_ENV: "1"}, SCORING), faults({}, SCORING)
    assert kept < default / 2, (kept, default)


def test_an_environment_that_tunes_malloc_is_left_alone(monkeypatch):
    monkeypatch.setattr(heap, "_kept", False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert heap.keep_freed_memory() is False
