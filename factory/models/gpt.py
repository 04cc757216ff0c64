"""A decoder-only transformer (GPT family), small enough to read in one sitting."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from factory.config.schema import ModelConfig
from factory.models.kv_cache import KVCache, LayerCache


ROPE_BASE = 10_000.0


def rotary_tables(context: int, head_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each position's rotation angle per pair of channels, (context, head_width / 2)."""
    inverse = 1.0 / (ROPE_BASE ** (torch.arange(0, head_width, 2, dtype=torch.float32) / head_width))
    angles = torch.outer(torch.arange(context, dtype=torch.float32), inverse)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (first half, second half) of x (batch, heads, time, width) by each position's angle."""
    return rotate_at(x, cos[: x.size(-2)], sin[: x.size(-2)])


def rotate_at(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs of x by angles already taken at its positions (cos and sin broadcast against x's halves)."""
    half = x.size(-1) // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class CausalSelfAttention(nn.Module):
    """Multi-head attention where each position sees only itself and the past."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.dropout = config.dropout
        self.rotary = config.positions == "rotary"
        if self.rotary:  # not in the state dict: derived from the config
            cos, sin = rotary_tables(config.context, config.n_embd // config.n_head)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attention over `x` (batch, time, width); with a cache, over the cached past too (at `positions`, under `mask`)."""
        batch, time, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, time, self.n_head, width // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is None:
            if self.rotary:
                q, k = rotate(q, self.cos, self.sin), rotate(k, self.cos, self.sin)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        else:
            if self.rotary:
                cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
                q, k = rotate_at(q, cos, sin), rotate_at(k, cos, sin)
            k, v = cache.update(k, v)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).contiguous().view(batch, time, width))


class Block(nn.Module):
    """Pre-norm transformer block: attention then MLP, each added to the residual stream."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(config.n_embd, 4 * config.n_embd),
            nn.GELU(),
            nn.Linear(4 * config.n_embd, config.n_embd),
            nn.Dropout(config.dropout),
        )

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """The block applied to the residual stream `x`; the cache arguments are passed on to attention."""
        x = x + self.attn(self.ln_1(x), cache, positions, mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token embeddings (+ learned positions, unless rotary), a stack of blocks, a language-model head."""

    supports_kv_cache = True
    """Generation may pass a `KVCache` to `forward` (see `factory.models.kv_cache`)."""

    def __init__(self, config: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.config = config
        self.vocab_size = vocab_size
        self.wte = nn.Embedding(vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.context, config.n_embd) if config.positions == "learned" else None
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        # Residual projections are scaled down with depth (GPT-2).
        for name, param in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_parameters(self) -> int:
        """Parameters, counting tied weights once."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits for every position of `idx` (batch, time); with a cache, `idx` is the chunk the cache was last fed."""
        _, time = idx.shape
        if cache is None and time > self.config.context:
            raise ValueError(f"sequence of {time} tokens is longer than the model's context ({self.config.context})")
        if cache is not None and cache.end > self.config.context:
            raise ValueError(f"the cache reaches {cache.end} positions, past the model's context ({self.config.context})")
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(time, device=idx.device) if cache is None else cache.positions)
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x) if cache is None else block(x, cache.layer(i), cache.positions, cache.mask)
        return self.lm_head(self.ln_f(x))

