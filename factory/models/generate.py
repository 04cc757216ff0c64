"""The one generator: evaluations, RL actors and Podium complete token prompts through it.

`generate` (or a `TorchEngine`) takes prompts of any lengths, batches them (sorted by length,
left-padded) and returns one `Completion` per prompt, in order. A model that opted into the KV
cache (`factory.models.kv_cache`) reads each prompt once and then one token per step; any other
model (a plugin architecture that maps ids to logits and nothing more) is run the way the factory
always ran it, the whole sequence again for every token, in batches of prompts of one length so
that no padding is needed.

The context window: a prompt longer than the model's `context` keeps its last `context` tokens.
While prompt and new tokens fit in the context, the cache holds them all. Past it the generator
slides, as the uncached path always did: each further token is computed from the last `context`
tokens of its row, afresh (a cache built for positions 0..context-1 cannot be shifted under
learned positions). Outputs are the same as without a cache either way; only the speed differs.

Devices: everything a generation holds (prompts, caches, sampling generators, the chosen tokens) lives on the model's
device, and one copy of the chosen tokens to the host per step serves the stop checks. On a GPU each batch's cache is
static (allocated once for prompt + new tokens, attended over whole under a mask) and its decode step is captured once
as a CUDA graph and replayed for every token, so a step costs one launch instead of one per kernel. Greedy tokens are
those of the uncached path in fp32 on the CPU (where the cache grows as it always did), and those of `transformers`'
`generate` on the same weights on a GPU (bench/gpu.py checks it).

`Engine` is the seam for a served inference engine (vLLM on a GPU cluster): token prompts and a
`Sampling` in, `Completion`s out. The in-process `TorchEngine` is the only one shipped.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import nn

from factory.devices import device_of
from factory.errors import StageFailed
from factory.models.kv_cache import KVCache, supports_kv_cache
from factory.models.sampling import Sampling, choose

Finish = Literal["eos", "stop", "length"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Completion:
    """What one prompt was extended by."""

    tokens: tuple[int, ...]
    """The new tokens, the one that ended the row (end-of-text or a stop) included."""
    logprobs: tuple[float, ...]
    """The log-probability of each token under the distribution it was chosen from (see `sampling.choose`)."""
    finish: Finish
    """Why it ended: it wrote end-of-text, a stop token or stop string, or it used its whole budget."""

    @property
    def text_tokens(self) -> tuple[int, ...]:
        """The tokens without a final end-of-text."""
        return self.tokens[:-1] if self.finish == "eos" else self.tokens


class Engine(Protocol):
    """Something that completes token prompts: the in-process `TorchEngine`, or a served engine behind the same calls.

    A served engine (vLLM) maps `Sampling` onto its own parameters (temperature, top_p, max_tokens, stop_token_ids with
    end-of-text, stop strings, seed, logprobs of the sampled token) and returns the same `Completion`s. Its seeded draws
    come from its own generators, so its samples differ from `TorchEngine`'s for the same seeds; greedy outputs agree up
    to its numerics. A caller that adds one should record which engine produced a result beside it (none does yet).
    """

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling, seeds: Sequence[int] | None = None) -> list[Completion]:
        """One completion per prompt, in order; `seeds` (one per prompt) when sampling, none when greedy."""
        ...


class TorchEngine:
    """Completes prompts with a torch model in this process, with its KV cache when it has one."""

    def __init__(self, model: nn.Module, context: int, *, batch_size: int = 32,
                 decode: Callable[[list[int]], str] | None = None, use_cache: bool = True, graphs: bool | None = None,
                 static: bool | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        self.model = model
        self.context = context
        self.batch_size = batch_size
        self.decode = decode
        """Token ids to text: needed for stop strings only."""
        self.cached = use_cache and supports_kv_cache(model)
        """Whether the model runs with a KV cache (it opted in, and the caller did not turn it off)."""
        self.device = device_of(model)
        """Where the model's weights are: prompts, caches, sampling and stop checks live there too."""
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        """Whether each batch's decode step runs as one CUDA graph replay over a static cache (on a GPU, by default)."""
        if self.graphs and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a GPU; it is on {self.device}")
        self.static = self.graphs or bool(static)
        """Whether decode steps run on a static cache (what a graph captures; without graphs, to test that path anywhere)."""

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling, seeds: Sequence[int] | None = None) -> list[Completion]:
        """One completion per prompt, in order; prompt i's draws come from a generator seeded with `seeds[i]` (on the
        model's device: on a GPU, seeds draw other samples than on the CPU)."""
        _check(prompts, sampling, seeds, self.decode)
        generators = [None] * len(prompts) if seeds is None else [torch.Generator(self.device).manual_seed(s) for s in seeds]
        rows = [_Row(list(p)[-self.context :], g, sampling) for p, g in zip(prompts, generators, strict=True)]
        self.model.eval()
        order = sorted(range(len(rows)), key=lambda i: (len(rows[i].tokens), i))
        with torch.no_grad():
            if self.cached:
                for start in range(0, len(order), self.batch_size):
                    self._cached([rows[i] for i in order[start : start + self.batch_size]], sampling)
            else:
                for _, same in itertools.groupby(order, key=lambda i: len(rows[i].tokens)):
                    group = list(same)
                    for start in range(0, len(group), self.batch_size):
                        self._uncached([rows[i] for i in group[start : start + self.batch_size]], sampling)
        return [row.completion() for row in rows]

    def _cached(self, rows: list[_Row], sampling: Sampling) -> None:
        """Extend `rows` with the KV cache: read the prompts once, then one token per step; slide once the context is full."""
        width = max(len(row.tokens) for row in rows)
        capacity = min(self.context, width + sampling.new_tokens)
        cache = KVCache(len(rows), capacity, self.device, static=self.static)
        ids, valid = _left_padded([row.tokens for row in rows], self.device)
        cache.feed(valid)
        logits = self.model(ids, cache)[:, -1]
        step_of: Callable[[torch.Tensor], torch.Tensor] | None = None  # made at the first decode step: there may be none
        used = width
        for step in range(sampling.new_tokens):
            active = [i for i, row in enumerate(rows) if row.finish is None]
            if not active:
                return
            if step > 0 and used < capacity:
                last = torch.tensor([row.tokens[-1] for row in rows], dtype=torch.int64).view(-1, 1).to(self.device)
                if self.static and step_of is None:
                    step_of = self._graphed(cache, len(rows)) if self.graphs else self._static_step(cache)
                if step_of is not None:
                    logits = step_of(last)
                else:
                    cache.feed(torch.ones(len(rows), 1, dtype=torch.bool, device=self.device))
                    logits = self.model(last, cache)[:, -1]
                used += 1
            elif step > 0:
                logits = torch.zeros(len(rows), *logits.shape[1:], dtype=logits.dtype, device=self.device)
                logits[active] = self._window([rows[i] for i in active])
            self._choose([rows[i] for i in active], logits[active], sampling)

    def _static_step(self, cache: KVCache) -> Callable[[torch.Tensor], torch.Tensor]:
        """The decode step on a static cache, run as it is (what `_graphed` captures)."""

        def step(last: torch.Tensor) -> torch.Tensor:
            cache.decode_step()
            out = self.model(last, cache)[:, -1]
            cache.advance()
            return out

        return step

    def _graphed(self, cache: KVCache, batch: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """The decode step of one batch on a static cache, captured once as a CUDA graph: `step(last)` (batch, 1) replays it
        and returns the next-token logits (a buffer the next replay overwrites). A warm-up run first (the kernels it picks
        are the graph's), whose changes to the cache are undone."""
        tokens = torch.zeros(batch, 1, dtype=torch.int64, device=self.device)
        step = self._static_step(cache)
        saved = cache.state()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            step(tokens)
        torch.cuda.current_stream(self.device).wait_stream(side)
        cache.restore(saved)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = step(tokens)

        def replay(last: torch.Tensor) -> torch.Tensor:
            tokens.copy_(last)
            graph.replay()
            return logits

        return replay

    def _window(self, rows: list[_Row]) -> torch.Tensor:
        """Next-token logits of each row from its last `context` tokens, computed afresh (past the context window)."""
        windows = [row.tokens[-self.context :] for row in rows]
        ids, valid = _left_padded(windows, self.device)
        cache = KVCache(len(rows), ids.size(1), self.device)
        cache.feed(valid)
        return self.model(ids, cache)[:, -1]

    def _uncached(self, rows: list[_Row], sampling: Sampling) -> None:
        """Extend `rows` (prompts of one length) the way a model without a cache runs: the whole sequence every step."""
        idx = torch.tensor([row.tokens for row in rows], dtype=torch.int64, device=self.device)
        for _ in range(sampling.new_tokens):
            active = [i for i, row in enumerate(rows) if row.finish is None]
            if not active:
                return
            logits = self.model(idx[:, -self.context :])[:, -1, :]
            self._choose([rows[i] for i in active], logits[active], sampling)
            last = torch.tensor([row.tokens[-1] for row in rows], dtype=torch.int64).view(-1, 1).to(self.device)
            idx = torch.cat([idx, last], dim=1)

    def _choose(self, rows: list[_Row], logits: torch.Tensor, sampling: Sampling) -> None:
        picked, logp = choose(logits, sampling, [row.generator for row in rows])
        both = torch.stack([picked.double(), logp.double()]).cpu()  # the one copy to the host a step makes
        for row, token, lp in zip(rows, both[0].long().tolist(), both[1].tolist(), strict=True):
            row.add(token, lp, self.decode)


def generate(model: nn.Module, prompts: Sequence[Sequence[int]], sampling: Sampling, *, context: int,
             seeds: Sequence[int] | None = None, batch_size: int = 32, decode: Callable[[list[int]], str] | None = None,
             use_cache: bool = True, graphs: bool | None = None, static: bool | None = None) -> list[Completion]:
    """One completion per prompt from `model` (see `TorchEngine`), in order, on the model's device."""
    try:
        engine = TorchEngine(model, context, batch_size=batch_size, decode=decode, use_cache=use_cache, graphs=graphs, static=static)
        return engine.generate(prompts, sampling, seeds)
    except torch.OutOfMemoryError as e:
        raise StageFailed(f"out of GPU memory generating {len(prompts)} prompt(s) in batches of {batch_size} with {sampling.new_tokens} "
                          "new tokens: lower the batch size (eval.batch_size for evaluations, rl.group_size for RL) or the new "
                          "tokens") from e


class _Row:
    """One prompt's tokens as they grow, and whether (and why) it has ended."""

    def __init__(self, prompt: list[int], generator: torch.Generator | None, sampling: Sampling) -> None:
        self.tokens = prompt
        self.prompt_length = len(prompt)
        self.generator = generator
        self.sampling = sampling
        self.logprobs: list[float] = []
        self.finish: Finish | None = None
        longest = max((len(s) for s in sampling.stop_strings), default=0)
        self._tail = 4 * longest + 1  # a token holds at least one byte and a character at most four

    def add(self, token: int, logprob: float, decode: Callable[[list[int]], str] | None) -> None:
        """Append a chosen token and end the row if it ends it."""
        self.tokens.append(token)
        self.logprobs.append(logprob)
        new = self.tokens[self.prompt_length :]
        if token == self.sampling.eos_id:
            self.finish = "eos"
        elif token in self.sampling.stop_ids:
            self.finish = "stop"
        elif self.sampling.stop_strings and decode is not None and _holds_stop(decode(new[-self._tail :]), self.sampling.stop_strings):
            self.finish = "stop"
        elif len(new) == self.sampling.new_tokens:
            self.finish = "length"

    def completion(self) -> Completion:
        """The finished row as a `Completion`."""
        assert self.finish is not None, "every row ends: at a stop or at its budget"
        return Completion(tokens=tuple(self.tokens[self.prompt_length :]), logprobs=tuple(self.logprobs), finish=self.finish)


def _holds_stop(text: str, stops: Sequence[str]) -> bool:
    return any(stop in text for stop in stops)


def _left_padded(rows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of different lengths as a (batch, longest) id tensor padded on the left with 0, and where the real tokens are
    (built on the host, then copied to `device` once)."""
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.int64)
    valid = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.int64)
        valid[i, width - len(row) :] = True
    return ids.to(device), valid.to(device)


def _check(prompts: Sequence[Sequence[int]], sampling: Sampling, seeds: Sequence[int] | None,
           decode: Callable[[list[int]], str] | None) -> None:
    """The guards every engine owes its callers: clear messages for calls that cannot be served."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("a prompt has no tokens; give it at least one (end-of-text starts a document)")
    if sampling.greedy and seeds is not None:
        raise ValueError("greedy decoding takes no seeds; set a temperature above 0 to sample")
    if not sampling.greedy and (seeds is None or len(seeds) != len(prompts)):
        raise ValueError(f"need one seed per row; got {0 if seeds is None else len(seeds)} seeds for {len(prompts)} rows")
    if sampling.stop_strings and decode is None:
        raise ValueError("stop strings need the engine's decode (token ids to text)")
