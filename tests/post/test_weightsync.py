"""Weight sync: learners' weights reach every actor bit for bit, over real gloo process groups, n learners -> m actors."""

import dataclasses
import hashlib
import json
import os
import random
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.functional import cross_entropy
from torch.nn.parallel import DistributedDataParallel

from factory.config.schema import ModelConfig
from factory.models.build import build_model
from factory.post.weightsync import SyncStats, WeightSync, assign_shards, roles_from
from tests.post.ranks import spawned

TINY = ModelConfig(n_layer=1, n_head=2, n_embd=16, context=8)
VOCAB = 50
CASES = ((2, 1), (1, 1), (1, 3), (2, 3))
"""(learners, actors); all run by one spawn of the largest world, the smaller cases on its first ranks. Both
learner ranks come first so that they pay DDP's first-use import of dynamo (a second or more) side by side."""
WORLD = max(learners + actors for learners, actors in CASES)
GROUP_TIMEOUT_S = 60
"""A rank stuck in a collective fails after this rather than hanging the test (a rank sitting out the
first cases waits in its next init_process_group for the others, so leave room)."""
SPAWN_TIMEOUT_S = 150


def _model(seed: int) -> torch.nn.Module:
    """The tiny GPT, plus buffers of other dtypes and odd sizes (bf16, a 0-d int64) that must travel too."""
    model = build_model(TINY, vocab_size=VOCAB, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    model.register_buffer("scale", torch.randn(3, generator=generator).to(torch.bfloat16))
    model.register_buffer("steps", torch.tensor(seed, dtype=torch.int64))
    return model


def _digest(model: torch.nn.Module) -> str:
    """sha256 of the state dict's names and tensor bytes, by name."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _train_step(model: DistributedDataParallel, rank: int) -> None:
    """One SGD step on this learner's own batch; DDP averages the gradients over the learner group."""
    tokens = torch.randint(0, VOCAB, (2, TINY.context + 1), generator=torch.Generator().manual_seed(rank))
    logits = model(tokens[:, :-1])
    cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).backward()
    with torch.no_grad():  # by hand: building a torch.optim optimizer imports dynamo, over a second per process
        for parameter in model.parameters():
            parameter -= 0.5 * parameter.grad
        model.module.steps += 1


def _push_twice(rank: int, learners: int, actors: int) -> dict:
    """This rank's digests before and after a push, a training step, and a second push."""
    roles = roles_from(rank, learners, actors)
    model = _model(seed=1 if roles.is_learner else 2)
    sync = WeightSync(roles, [*model.named_parameters(), *model.named_buffers()])
    before = _digest(model)
    if roles.is_learner:
        model = DistributedDataParallel(model, process_group=sync.learner_group)
    first = sync.push(model, version=7 if roles.is_learner else -1)
    inner = model.module if roles.is_learner else model
    after_first = _digest(inner)
    if roles.is_learner:
        _train_step(model, rank)
    second = sync.push(model, version=8 if roles.is_learner else -1)
    return {"learner": roles.is_learner, "before": before, "first": after_first, "first_stats": dataclasses.asdict(first),
            "second": _digest(inner), "second_stats": dataclasses.asdict(second)}


def _rank(rank: int, port: int, out: str) -> None:
    """One spawned process: joins the world of each case it has a rank in, pushes, writes what it saw."""
    torch.set_num_threads(1)
    timeout = timedelta(seconds=GROUP_TIMEOUT_S)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    for learners, actors in CASES:
        if rank >= learners + actors:
            continue
        dist.init_process_group("gloo", store=dist.PrefixStore(f"{learners}-{actors}", store), rank=rank,
                                world_size=learners + actors, timeout=timeout)
        try:
            result = _push_twice(rank, learners, actors)
        finally:
            dist.destroy_process_group()
        (Path(out) / f"{learners}-{actors}-{rank}.json").write_text(json.dumps(result))
    os._exit(0)  # results are written; skip the interpreter's teardown of torch, seconds per process on two cores


@pytest.fixture(scope="module")
def pushes(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int], list[dict]]:
    """Every case's per-rank results, in rank order, from one spawn of WORLD processes."""
    out = tmp_path_factory.mktemp("weightsync")
    with spawned(_rank, (str(out),), nprocs=WORLD, timeout_s=SPAWN_TIMEOUT_S):
        pass
    return {(learners, actors): [json.loads((out / f"{learners}-{actors}-{rank}.json").read_text())
                                 for rank in range(learners + actors)]
            for learners, actors in CASES}


@pytest.mark.parametrize(("learners", "actors"), CASES, ids=[f"{n}-learners-{m}-actors" for n, m in CASES])
def test_a_push_makes_every_actor_bitwise_equal_to_the_learners(pushes, learners, actors):
    ranks = pushes[(learners, actors)]
    taught, acting = ranks[:learners], ranks[learners:]
    assert all(rank["learner"] for rank in taught) and not any(rank["learner"] for rank in acting)
    for stage, version in (("first", 7), ("second", 8)):
        assert len({rank[stage] for rank in taught}) == 1, f"learners disagree after the {stage} push"
        assert all(rank[stage] == taught[0][stage] for rank in acting), f"an actor differs after the {stage} push"
        assert all(rank[f"{stage}_stats"]["version"] == version for rank in ranks)
        sent = sum(rank[f"{stage}_stats"]["bytes"] for rank in taught)
        assert all(rank[f"{stage}_stats"]["bytes"] == sent > 0 for rank in acting)
    assert all(rank["before"] != taught[0]["before"] for rank in acting)
    assert taught[0]["second"] != taught[0]["first"], "the training step changed nothing, so the second push proves nothing"


def test_without_actors_a_push_is_a_no_op_in_a_world_of_one():
    model = _model(seed=1)
    before = _digest(model)
    sync = WeightSync(roles_from(0, 1, 0), list(model.named_parameters()))
    assert sync.push(model, version=3) == SyncStats(seconds=0.0, bytes=0, version=3)
    assert sync.learner_group is None and not dist.is_initialized()
    assert _digest(model) == before


def test_shards_cover_every_parameter_once_and_balance_bytes():
    assert assign_shards({"a": 8, "b": 5, "c": 4, "d": 3}, 2) == (("a", "d"), ("b", "c"))
    assert assign_shards({"y": 4, "x": 4}, 3) == (("x",), ("y",), ())
    sizes = {name: p.numel() * p.element_size() for name, p in build_model(TINY, vocab_size=VOCAB, seed=0).named_parameters()}
    shuffled = list(sizes.items())
    random.Random(0).shuffle(shuffled)
    for learners in (1, 2, 3, 5):
        shards = assign_shards(sizes, learners)
        assert sorted(name for shard in shards for name in shard) == sorted(sizes)
        loads = [sum(sizes[name] for name in shard) for shard in shards]
        assert max(loads) - min(loads) <= max(sizes.values()), loads
        assert assign_shards(dict(shuffled), learners) == shards


def test_roles_place_learners_before_actors_and_reject_ranks_outside_the_world():
    assert [(r.is_learner, r.is_actor) for r in (roles_from(rank, 2, 3) for rank in range(5))] == [(True, False)] * 2 + [(False, True)] * 3
    assert roles_from(4, 2, 3).size == 5
    with pytest.raises(ValueError, match=r"rank 5 is outside a world of 2 learners \+ 3 actors"):
        roles_from(5, 2, 3)
    with pytest.raises(ValueError, match="rank -1"):
        roles_from(-1, 2, 3)
    with pytest.raises(ValueError, match="learners=0"):
        roles_from(0, 0, 3)
    with pytest.raises(ValueError, match="actors=-1"):
        roles_from(0, 1, -1)


def test_a_world_of_several_needs_torch_distributed_started():
    with pytest.raises(RuntimeError, match="1 learners \\+ 1 actors"):
        WeightSync(roles_from(0, 1, 1), list(build_model(TINY, vocab_size=VOCAB, seed=0).named_parameters()))
