"""Meta-device initialisation for FSDP: the values replayed onto the meta model are the bytes `build_model` gives, on two
real ranks the sharded model is `build_model`'s (buffers and tied weights included), and an initialisation that cannot be
split is refused with what to change."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from factory.config.schema import ModelConfig
from factory.errors import ConfigError
from factory.models.build import build_model
from factory.train.meta_init import build_on_meta, replay, rows_of, sharded_build
from tests.train.conftest import REPO

SHAPES = {
    "gpt": ModelConfig(n_layer=2, n_head=2, n_embd=64, context=32, dropout=0.1),
    "gpt-rotary": ModelConfig(n_layer=2, n_head=2, n_embd=64, context=32, positions="rotary"),
    "llama": ModelConfig(arch="llama", n_layer=2, n_head=2, n_kv_head=1, n_embd=64, context=32),
    "llama-untied": ModelConfig(arch="llama", n_layer=2, n_head=2, n_kv_head=1, n_embd=64, context=32, tie_embeddings=False),
}
VOCAB = 67  # odd: the ranks' rows of the embeddings differ in number

# On two ranks, as FSDP training builds them: first a model of about 680 MB, each rank reporting how much its peak resident
# memory grew (a high-water mark: measured before anything else is built); then every shape of `argv[1]`, rank 0 saving
# the whole state it holds of each.
TWO_RANKS = textwrap.dedent(
    """
    import json, os, resource, sys
    import torch
    from torch.distributed.tensor import DTensor
    from factory.config.schema import ModelConfig, PretrainConfig
    from factory.train.distributed import join, leave, world_from_env
    from factory.train.heap import keep_freed_memory
    from factory.train.parallel import build_for_training

    keep_freed_memory(sharded=True)  # as FSDP training on several ranks does
    world = world_from_env()
    join(world)
    config = PretrainConfig(steps=5, parallelism="fsdp", checkpoint_format="sharded")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    model = build_for_training(ModelConfig(n_layer=24, n_head=12, n_embd=768, context=256), 8000, 0, config, world)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    with open(sys.argv[2] + f".{world.rank}", "w") as out:
        json.dump({"grown": grown, "whole": whole}, out)
    del model

    config = PretrainConfig(steps=5, parallelism="fsdp", checkpoint_format="sharded", activation_checkpointing="full")
    states = {}
    for name, shape in torch.load(sys.argv[1], weights_only=False).items():
        model = build_for_training(ModelConfig.model_validate(shape), 67, 7, config, world)
        params = dict(model.named_parameters(remove_duplicate=False))
        states[name] = {
            "state": {key: value.full_tensor() for key, value in model.state_dict().items()},
            "buffers": {key: value.clone() for key, value in model.named_buffers()},
            "local": sum(p.to_local().numel() for p in model.parameters()),
            "tied": params["lm_head.weight"] is params[next(iter(params))],
            "sharded": all(isinstance(p, DTensor) for p in params.values()),
        }
    if world.is_main:
        torch.save(states, sys.argv[3])
    leave(world)
    os._exit(0)  # as a stage's ranks end (`exit_now`): a thread torch leaves joinable can abort the interpreter's exit
    """
)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """TWO_RANKS run under torchrun (one launch for both tests that read it): its directory, with `peak.<rank>` and
    `states.pt`."""
    tmp_path = tmp_path_factory.mktemp("two-ranks")
    torch.save({name: shape.model_dump() for name, shape in SHAPES.items()}, tmp_path / "shapes.pt")
    (tmp_path / "two_ranks.py").write_text(TWO_RANKS)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(tmp_path / "two_ranks.py"),
                           str(tmp_path / "shapes.pt"), str(tmp_path / "peak"), str(tmp_path / "states.pt")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp_path


@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_the_values_replayed_onto_the_meta_model_are_the_bytes_build_model_gives(shape):
    config = SHAPES[shape]
    whole = build_model(config, VOCAB, 7)
    before = torch.random.get_rng_state()
    model, places = build_on_meta(config, VOCAB, 7)
    assert all(p.device.type == "meta" for p in model.parameters())
    for name, buffer in whole.named_buffers():
        assert torch.equal(dict(model.named_buffers())[name], buffer), name
    values = {}
    replay(config, VOCAB, 7, places, lambda names, value: values.update({name: value.clone() for name in names}))
    assert torch.equal(torch.random.get_rng_state(), before), "the global generator is left as it was"
    assert values.keys() == dict(whole.named_parameters(remove_duplicate=False)).keys()
    for name, param in whole.named_parameters(remove_duplicate=False):
        assert torch.equal(values[name], param.detach()), name
    assert torch.equal(torch.cat([rows_of(values["lm_head.weight"], rank, 3) for rank in range(3)]), values["lm_head.weight"])


@pytest.mark.slow
def test_fsdp_on_two_ranks_initialises_the_weights_of_build_model_each_rank_holding_half(two_ranks):
    states = torch.load(two_ranks / "states.pt", weights_only=False)
    for name, config in SHAPES.items():
        whole, ours = build_model(config, VOCAB, 7), states[name]
        theirs = whole.state_dict()
        assert ours["state"].keys() == theirs.keys()
        assert all(torch.equal(ours["state"][key], value) for key, value in theirs.items()), name
        assert ours["buffers"].keys() == dict(whole.named_buffers()).keys()
        assert all(torch.equal(ours["buffers"][key], value) for key, value in whole.named_buffers()), name
        assert ours["tied"] == config.tie_embeddings and ours["sharded"]
        total = sum(p.numel() for p in whole.parameters())
        assert 0.4 * total < ours["local"] < 0.6 * total, (name, ours["local"], total)


def test_an_initialisation_that_reads_what_it_overwrites_is_refused_with_what_to_change():
    class Doubled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(4, 4))
            with torch.no_grad():
                self.weight.mul_(2)  # reads the ones: this rank has only its rows of them

    class ThroughData(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.empty(4, 4))
            self.weight.data.normal_()

    with pytest.raises(ConfigError, match=r"architecture 'tiny' initialises a parameter with mul_.*use parallelism: ddp"):
        with sharded_build("tiny", lambda place, value: None):
            Doubled()
    with pytest.raises(ConfigError, match=r"not one of its parameters .*use parallelism: ddp"):
        with sharded_build("tiny", lambda place, value: None):
            ThroughData()
    def truncated() -> nn.Linear:  # draws, then reads what it drew until it is in range
        torch.manual_seed(3)
        linear = nn.Linear(5, 3)
        nn.init.trunc_normal_(linear.weight, std=0.02, a=-0.03, b=0.03)
        return linear

    written = []
    with sharded_build("tiny", lambda place, value: written.append((place, value.clone()))):
        truncated()
    assert [place for place, _ in written] == [0, 1, 0, 1, 0], "registered (weight, bias), then kaiming, bias, truncated normal"
    assert torch.equal(written[-1][1], truncated().weight.detach()) and torch.equal(written[-2][1], truncated().bias.detach())
    assert rows_of(torch.arange(5), 1, 4).tolist() == [2, 3] and rows_of(torch.arange(5), 3, 4).tolist() == []


@pytest.mark.slow
def test_no_fsdp_rank_holds_the_whole_model_while_it_is_built(two_ranks):
    for rank in (0, 1):
        measured = json.loads((two_ranks / f"peak.{rank}").read_text())
        # half the model (its shard) and one whole parameter at a time; building it whole takes more than the model
        assert measured["grown"] < 0.75 * measured["whole"], measured
