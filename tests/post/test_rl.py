"""The GRPO loop on a tiny model: seeded sampling, metrics, checkpoints, exact resume, and the actor/learner split."""

import functools
import hashlib
import json
import logging
import os
from datetime import timedelta
from itertools import islice
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from tokenizers import Tokenizer
from torch.nn import functional as F

from factory.config.schema import ModelConfig, RLConfig, TokenizerConfig
from factory.data.loader import PAD
from factory.models.build import build_model
from factory.models.tokenizer import train_tokenizer
from factory.post.format import completion, prompt
from factory.post.rl import sample_group, stop_tokens, train_rl
from factory.post.sft import encode_examples, sft_batches
from factory.post.weightsync import roles_from
from factory.train.records import published
from tests.post.ranks import spawned

ROWS = [
    {"id": f"t{i:02d}", "function": f"def f(x):\n    return x + {i}\n", "call": f"f({i})", "expected": repr(2 * i)} for i in range(16)
]
MODEL = ModelConfig(n_layer=1, n_head=2, n_embd=32, context=48)
LLAMA = ModelConfig(arch="llama", n_layer=1, n_head=2, n_kv_head=1, n_embd=32, context=48)
LOG = logging.getLogger("test-rl")


def tokenizer():
    texts = [prompt(r["function"], r["call"]) + completion(r["expected"]) for r in ROWS] * 10
    return train_tokenizer(texts, TokenizerConfig(vocab_size=300, min_frequency=2))


def config(**changes) -> RLConfig:
    base = {"steps": 4, "prompts_per_step": 2, "group_size": 4, "lr": 1e-3, "max_new_tokens": 6, "checkpoint_every": 2,
            "log_every": 1, "actors": 0, "sandbox_seconds": 2.0}
    return RLConfig(**{**base, **changes})


def final_digest(work: Path) -> str:
    last = published(work / "checkpoints")[-1]
    state = torch.load(last.path, map_location="cpu", weights_only=True)["model"]
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode() + state[name].numpy().tobytes())
    return digest.hexdigest()


def fine_tuned(tok, model: ModelConfig = MODEL) -> dict[str, torch.Tensor]:
    """A model taught the answer format for a few steps, so its samples earn some rewards and some not: trained once per
    test process, and each caller gets its own copy."""
    return {name: tensor.clone() for name, tensor in _fine_tuned(tok.to_str(), model).items()}


@functools.cache
def _fine_tuned(tokenizer_json: str, config: ModelConfig) -> dict[str, torch.Tensor]:
    tok = Tokenizer.from_str(tokenizer_json)
    model = build_model(config, tok.get_vocab_size(), seed=7)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for batch in islice(sft_batches(encode_examples(ROWS, tok, 0, config.context), 8, seed=0, eos_id=0), 60):
        optimizer.zero_grad()
        logits = model(batch.x)
        F.cross_entropy(logits.view(-1, logits.size(-1)), batch.y.view(-1), ignore_index=PAD).backward()
        optimizer.step()
    return model.state_dict()


def run(work: Path, rl: RLConfig, rank: int = 0, learners: int = 1, actors: int = 0, model: ModelConfig = MODEL) -> dict:
    tok = tokenizer()
    init = fine_tuned(tok, model)
    result = train_rl(ROWS, tok, 0, init, model, rl, 5, roles_from(rank, learners, actors), work, LOG)
    return result.last


def test_sampling_is_seeded_per_completion_and_stops_at_the_line_end():
    tok = tokenizer()
    model = build_model(MODEL, tok.get_vocab_size(), seed=1)
    ids = tok.encode(prompt(ROWS[0]["function"], ROWS[0]["call"])).ids
    stops = stop_tokens(tok, 0)
    together, mask, logp = sample_group(model, ids, [11, 12, 13], config(), stops, 0, MODEL.context)
    alone, alone_mask, alone_logp = sample_group(model, ids, [12], config(), stops, 0, MODEL.context)
    width = alone.size(1)
    assert torch.equal(together[1, :width], alone[0]) and torch.allclose(logp[1, : alone_logp.size(1)], alone_logp[0])
    new = together[:, len(ids):]
    for row, row_mask in zip(new, mask, strict=True):
        n = int(row_mask.sum())
        assert row_mask[:n].all() and not row_mask[n:].any()  # tokens up to and including the first stop
        ended = [i for i, t in enumerate(row.tolist()) if t in set(stops.tolist())]
        if ended:
            assert n == ended[0] + 1
    assert (logp <= 0).all()


@pytest.mark.parametrize("model", [MODEL, LLAMA], ids=["gpt", "llama"])
def test_a_run_logs_its_metrics_and_resumes_to_the_same_bytes(tmp_path, model):
    last = run(tmp_path / "whole", config(), model=model)
    for key in ("reward_mean", "reward_std", "pass_rate", "kl", "entropy", "response_tokens", "sync_seconds", "lag_versions"):
        assert key in last
    assert last["step"] == 4 and last["lag_versions"] == 0
    assert [c.step for c in published(tmp_path / "whole" / "checkpoints")] == [2, 4]
    run(tmp_path / "cut", config(steps=2), model=model)  # a run stopped at its step-2 checkpoint...
    run(tmp_path / "cut", config(), model=model)  # ...relaunched with the whole plan, resumes there
    assert final_digest(tmp_path / "cut") == final_digest(tmp_path / "whole")


def test_updates_move_the_weights(tmp_path):
    last = run(tmp_path / "a", config(steps=2))
    assert 0 < last["format_rate"] and last["reward_std"] > 0  # something to learn from
    init = fine_tuned(tokenizer())
    state = torch.load(published(tmp_path / "a" / "checkpoints")[-1].path, weights_only=True)["model"]
    assert any(not torch.equal(init[name], state[name]) for name in init)


CASES = ((1, 1, 1), (2, 1, 1), (1, 1, 2))
"""(learners, actors, sync_every), all run by one spawn of the largest world, the smaller cases on its first ranks."""
SPAWN_TIMEOUT_S = 300


def _rank(rank: int, port: int, out: str) -> None:
    """One spawned process: joins the world of each case it has a rank in and trains its part."""
    timeout = timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    tok = Tokenizer.from_file(str(Path(out) / "tokenizer.json"))
    init = torch.load(Path(out) / "init.pt", weights_only=True)
    for learners, actors, sync_every in CASES:
        if rank >= learners + actors:
            continue
        name = f"{learners}-{actors}-{sync_every}"
        dist.init_process_group("gloo", store=dist.PrefixStore(name, store), rank=rank, world_size=learners + actors, timeout=timeout)
        try:
            rl = config(actors=actors, learners=learners, sync_every=sync_every)
            train_rl(ROWS, tok, 0, init, MODEL, rl, 5, roles_from(rank, learners, actors), Path(out) / name, LOG)
        finally:
            dist.destroy_process_group()
    os._exit(0)  # skip the interpreter's teardown of torch, seconds per process on two cores


@pytest.fixture(scope="module")
def split_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The work directories of every case, from one spawn of real processes over gloo; and `alone`, the same run in one process."""
    out = tmp_path_factory.mktemp("rl-split")
    tok = tokenizer()
    tok.save(str(out / "tokenizer.json"))
    torch.save(fine_tuned(tok), out / "init.pt")
    with spawned(_rank, (str(out),), nprocs=max(n + m for n, m, _ in CASES), timeout_s=SPAWN_TIMEOUT_S):
        run(out / "alone", config())  # meanwhile, the same runs in one process
        run(out / "alone-sync-2", config(sync_every=2))
    return out


def weights(work: Path) -> dict[str, torch.Tensor]:
    return torch.load(published(work / "checkpoints")[-1].path, weights_only=True)["model"]


def test_one_actor_process_gives_the_colocated_result_bitwise(split_runs):
    assert len((split_runs / "1-1-1" / "metrics.jsonl").read_text().splitlines()) == 4
    assert final_digest(split_runs / "1-1-1") == final_digest(split_runs / "alone")  # same samples, same updates: same bytes


def test_two_learners_and_an_actor_give_the_colocated_result(split_runs):
    alone, split = weights(split_runs / "alone"), weights(split_runs / "2-1-1")
    assert all(torch.allclose(alone[k], split[k], atol=1e-5) for k in alone)  # gradients averaged over two learners: rounding only


def test_lagging_actors_record_how_far_behind_they_are(split_runs):
    lags = [json.loads(line)["lag_versions"] for line in (split_runs / "1-1-2" / "metrics.jsonl").read_text().splitlines()]
    assert lags == [0, 1, 0, 1]  # pushed every 2 updates: the second batch of each pair comes from weights one update old
    assert final_digest(split_runs / "1-1-2") != final_digest(split_runs / "alone")
    # sampling in the learner lags the same way: placement does not change the result (it is not in the fingerprint)
    assert final_digest(split_runs / "1-1-2") == final_digest(split_runs / "alone-sync-2")
