"""Generation speed: the KV-cache generator vs. the uncached path it replaced, side by side in one run (`make bench`).

Tokens/s of `factory.models.generate` (prompts read once, then one token per step through the
KV cache) and of the generator the factory had before it (the whole sequence again for every new
token, kept below as `uncached`), at 32, 128 and 512 new tokens, on the shapes of the tiny model
(experiments/tiny-code-lm.md) and the nightly model (experiments/nightly.md), random-init weights,
greedy, a batch of `BATCH` prompts of `PROMPT_TOKENS` tokens. Both sides compute the same tokens
(checked). Goal: >= 5x at 128 new tokens.

The shipped models have a context of 128 tokens, which 32 prompt tokens + 128 or 512 new ones
overflow; past the context both generators recompute a sliding window, so the cache would only
measure part of the run. The bench models get a context of `CONTEXT` instead (only the learned
position table grows); everything else is the recipe's shape.

One torch thread (`THREADS`): on a busy 2-core machine more threads made every figure swing by an order of magnitude.
Timed runs alternate (uncached, cached, ...) and the best of each is kept, so a noisy neighbour
on the shared cores hurts both sides alike. `--smoke`: a few new tokens, one round, to check the bench runs.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from factory.config.schema import ModelConfig
from factory.models.build import build_model
from factory.models.generate import generate
from factory.models.sampling import Sampling

VOCAB = 2048
"""The recipes' tokenizer vocabulary."""
CONTEXT = 1024
BATCH = 4
PROMPT_TOKENS = 32
NEW_TOKENS = (32, 128, 512)
ROUNDS = 2
SMOKE_NEW_TOKENS = (4, 8)
THREADS = 1
"""One intra-op thread: on the shared 2-core machine, two threads stall each other under load (both sides saw 10-30x swings)."""
SHAPES = {
    "tiny": ModelConfig(n_layer=2, n_head=4, n_embd=128, context=CONTEXT),
    "nightly": ModelConfig(n_layer=4, n_head=4, n_embd=192, context=CONTEXT),
}


@torch.no_grad()
def uncached(model: nn.Module, prompts: torch.Tensor, new_tokens: int, context: int) -> torch.Tensor:
    """The generator before the KV cache (the old factory/evals/generate.py, greedy): the whole sequence again per token."""
    model.eval()
    idx = prompts
    for _ in range(new_tokens):
        logits = model(idx[:, -context:])[:, -1, :].float()
        idx = torch.cat([idx, logits.argmax(dim=-1).view(-1, 1)], dim=1)
    return idx[:, prompts.size(1) :]


def best_seconds(run, rounds: int) -> tuple[float, object]:
    """The shortest of `rounds` timed runs, and what the last returned."""
    times, out = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - started)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help=f"{' and '.join(map(str, SMOKE_NEW_TOKENS))} new tokens, one round: "
                        "checks the bench runs")
    smoke = parser.parse_args().smoke
    lengths, most_rounds = (SMOKE_NEW_TOKENS, 1) if smoke else (NEW_TOKENS, ROUNDS)
    torch.set_num_threads(THREADS)
    prompts = torch.randint(0, VOCAB, (BATCH, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))
    print(f"generation, greedy, batch {BATCH} x {PROMPT_TOKENS} prompt tokens, context {CONTEXT} (see the module docstring), "
          f"best of {most_rounds} (512: 1), {torch.get_num_threads()} threads")
    print(f"{'model':<8} {'params':>8} {'new':>5} {'uncached tok/s':>15} {'cached tok/s':>13} {'cached / uncached':>18}  same tokens")
    for name, config in SHAPES.items():
        model = build_model(config, VOCAB, seed=0).eval()
        params = sum(p.numel() for p in model.parameters())
        generate(model, prompts[:, :8].tolist(), Sampling(new_tokens=4), context=CONTEXT)  # warm-up, untimed
        for new in lengths:
            rounds = 1 if new >= 512 else most_rounds
            old_s = new_s = float("inf")
            old = cached = None
            for _ in range(rounds):  # alternate, so both sides see the same neighbours
                s, old = best_seconds(lambda: uncached(model, prompts, new, CONTEXT), 1)
                old_s = min(old_s, s)
                s, cached = best_seconds(lambda: generate(model, prompts.tolist(), Sampling(new_tokens=new), context=CONTEXT), 1)
                new_s = min(new_s, s)
            same = old.tolist() == [list(c.tokens) for c in cached]
            tokens = BATCH * new
            print(f"{name:<8} {params / 1e6:>7.2f}M {new:>5} {tokens / old_s:>15,.0f} {tokens / new_s:>13,.0f} "
                  f"{old_s / new_s:>17.1f}x  {'yes' if same else 'NO'}")
    print("goal: cached / uncached >= 5x at 128 new tokens")


if __name__ == "__main__":
    main()
