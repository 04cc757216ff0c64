"""`pretrain.compile: true` under `parallelism: fsdp` on two CPU ranks: inductor compiles the sharded blocks (it needs the
machine's C++ compiler) and the run trains as the uncompiled one does."""

import shutil

import pytest
import torch

from factory.train.checkpoint import load_checkpoint
from factory.train.pretrain import CHECKPOINT_DIR
from tests.train.test_fsdp import losses
from tests.train.test_resume import finish, launch

pytestmark = [
    pytest.mark.slow,  # two-rank worlds, and inductor's first compile (about 25 s on 2 cores)
    pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="inductor compiles C++ on the CPU"),
]


def test_a_compiled_fsdp_run_follows_the_uncompiled_one(tmp_path):
    works = {}
    for name, extra in (("eager", {}), ("compiled", {"compile": True})):
        works[name] = tmp_path / name / "work"
        works[name].parent.mkdir()
        finish(launch(works[name], steps=8, every=8, ranks=2, dropout=0.0, parallelism="fsdp", extra=extra))
    eager, compiled = losses(works["eager"]), losses(works["compiled"])
    assert len(compiled) == 8 and compiled[-1] < compiled[0], "it learns"
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-5, atol=1e-5)  # fused kernels round otherwise
    ours, theirs = (load_checkpoint(works[name] / CHECKPOINT_DIR / "step_000008") for name in ("compiled", "eager"))
    for name, weight in theirs["model"].items():
        torch.testing.assert_close(ours["model"][name], weight, rtol=1e-3, atol=1e-4)  # float noise, amplified by Adam
