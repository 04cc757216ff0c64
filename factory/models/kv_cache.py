"""A key/value cache for decoder-only attention, shared by every architecture that opts into it.

Generation feeds a model chunks of tokens: first the (left-padded) prompts, then one token per
row per step. Before each chunk the generator calls `KVCache.feed(valid)`; the model then reads
the chunk's `positions` (for learned or rotary positions) and, in each attention layer, stores
its new keys and values with `cache.layer(i).update(k, v)`, which returns every key and value
so far, and attends with `mask`, which hides left padding and the future.

How an architecture opts in (the GPT in `factory.models.gpt` is the worked example):

1. Set the class attribute `supports_kv_cache = True`.
2. Give `forward` a keyword argument `cache: KVCache | None = None`. With no cache, nothing
   changes (training never passes one).
3. With a cache: take position ids from `cache.positions` (batch, time) instead of
   `arange(time)`: index learned position embeddings with them, or gather rotary tables at them.
4. In attention layer i, after the q/k/v projections (and rotary): `k, v = cache.layer(i).update(k, v)`,
   then `scaled_dot_product_attention(q, k, v, attn_mask=cache.mask)` instead of `is_causal=True`
   (grouped-query attention: store the kv heads as they are, pass `enable_gqa=True`).

5. On a GPU the generator makes the cache static (`static=True`): after the prompts, `update` writes each token at the
   slot `cache.slot` holds and returns every slot, and `mask` covers them all; the decode step is then captured as a CUDA
   graph, so the cached forward must not read tensors on the host (`.item()`, a Python branch on a tensor's value).

The cache is a plain object beside the model, never a module buffer: a model's state dict (and so
its checkpoints and exported bytes) is the same whether it has generated or not.
"""

from __future__ import annotations

import torch


class LayerCache:
    """The keys and values of one attention layer, preallocated for the whole generation."""

    def __init__(self, cache: KVCache) -> None:
        self._cache = cache
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None

    def update(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this chunk's keys and values (batch, heads, time, width); returns all of them so far (batch, heads, end, width)."""
        start, end = self._cache.start, self._cache.end
        if self._keys is None or self._values is None:
            batch, heads, _, width = keys.shape
            # Zeros, not garbage: a static decode attends over every slot, and a masked slot's weight 0 times NaN is NaN.
            make = keys.new_zeros if self._cache.static else keys.new_empty
            self._keys = make(batch, heads, self._cache.capacity, width)
            self._values = make(batch, heads, self._cache.capacity, values.size(-1))
        if self._cache.decoding:  # one token per row, at the slot a tensor holds: the same kernels every step
            self._keys.index_copy_(2, self._cache.slot, keys)
            self._values.index_copy_(2, self._cache.slot, values)
            return self._keys, self._values
        if keys.size(2) != end - start:
            raise ValueError(f"the chunk has {keys.size(2)} positions but the cache was fed {end - start}")
        self._keys[:, :, start:end] = keys
        self._values[:, :, start:end] = values
        return self._keys[:, :, :end], self._values[:, :, :end]


class KVCache:
    """Keys and values of every attention layer for `batch` rows, up to `capacity` positions each."""

    def __init__(self, batch: int, capacity: int, device: torch.device | str = "cpu", static: bool = False) -> None:
        self.capacity = capacity
        self.static = static
        """Static shapes: after the prompts, every step attends over all `capacity` slots (see `decode_step`)."""
        self.decoding = False
        """Whether `decode_step` has begun (static caches only): each layer then writes at `slot`."""
        self.slot = torch.zeros(1, dtype=torch.int64, device=device)
        """Where a static decode step writes its token (a tensor, so that a captured CUDA graph reads it anew each replay)."""
        self._slots = torch.arange(capacity, device=device)
        self.start = 0
        """Where the current chunk begins."""
        self.end = 0
        """Where it ends: the positions filled once the model has run on it."""
        self._valid = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        self._seen = torch.zeros(batch, dtype=torch.int64, device=device)
        self._layers: dict[int, LayerCache] = {}
        self.positions = torch.zeros(batch, 0, dtype=torch.int64, device=device)
        """Position ids of the current chunk (batch, time): a row's real tokens are numbered from 0, padding ignored."""
        self.mask = torch.zeros(batch, 1, 0, 0, dtype=torch.bool, device=device)
        """Which slots each query of the chunk may attend to (batch, 1, time, end): real tokens at or before it."""

    def layer(self, index: int) -> LayerCache:
        """The cache of attention layer `index` (made on first use, so the cache need not know how deep the model is)."""
        if index not in self._layers:
            self._layers[index] = LayerCache(self)
        return self._layers[index]

    def feed(self, valid: torch.Tensor) -> None:
        """Announce the next chunk: `valid` (batch, time) is False where a slot is left padding, True for a real token."""
        time = valid.size(1)
        if self.end + time > self.capacity:
            raise ValueError(f"the cache holds {self.capacity} positions; {self.end} are used and {time} more were fed")
        self.start, self.end = self.end, self.end + time
        self._valid[:, self.start : self.end] = valid
        counts = self._seen.unsqueeze(1) + valid.long().cumsum(dim=1)
        self.positions = (counts - 1).clamp(min=0)
        self._seen = counts[:, -1]
        slots = torch.arange(self.end, device=valid.device)
        queries = torch.arange(self.start, self.end, device=valid.device).unsqueeze(1)
        causal = slots.unsqueeze(0) <= queries  # (time, end)
        # A padding slot attends to itself, so that no query row is all masked (which would give NaN).
        self.mask = ((self._valid[:, None, : self.end] & causal) | (slots == queries)).unsqueeze(1)
        self.slot.fill_(self.end)

    def decode_step(self) -> None:
        """Announce one more real token per row on a static cache, with tensor operations alone: positions, the mask over
        every slot, and the slot each layer writes, all on the cache's device, the same shapes every step. What a CUDA
        graph of the decode step captures; call `advance` after the model ran."""
        if not self.static:
            raise ValueError("decode_step needs a cache made with static=True")
        if self.end >= self.capacity:
            raise ValueError(f"the cache holds {self.capacity} positions, all of them used")
        self.decoding = True
        self._valid.index_fill_(1, self.slot, True)
        self.positions = self._seen.view(-1, 1).clone()
        self._seen.add_(1)
        self.mask = (self._valid & (self._slots <= self.slot)).view(self._valid.size(0), 1, 1, self.capacity)

    def advance(self) -> None:
        """After a static decode step: the next one writes one slot further."""
        self.slot.add_(1)

    def state(self) -> tuple[torch.Tensor, ...]:
        """Copies of what a decode step changes besides keys and values (a warm-up run before capturing a graph restores them)."""
        return self.slot.clone(), self._seen.clone(), self._valid.clone()

    def restore(self, state: tuple[torch.Tensor, ...]) -> None:
        """Put back what `state` copied."""
        for live, saved in zip((self.slot, self._seen, self._valid), state, strict=True):
            live.copy_(saved)


def supports_kv_cache(model: torch.nn.Module) -> bool:
    """Whether `model` opted into the cache (see this module's docstring); other models are run without one."""
    return bool(getattr(type(model), "supports_kv_cache", False))
