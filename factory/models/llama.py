"""A decoder-only transformer of the Llama family: RMSNorm, SwiGLU MLP, rotary positions, grouped-query attention, no biases.

The math is Hugging Face's `LlamaForCausalLM`, so its exported weights give the same logits there: RMSNorm in float32,
rotary pairs of channels (i, i + width / 2) ("rotate half"), key/value head j serving query heads j * g .. j * g + g - 1.
Attention is projections, then rotary, then `scaled_dot_product_attention`, so a key/value cache can sit between the
last two.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from factory.config.schema import ModelConfig
from factory.models.kv_cache import KVCache, LayerCache


class RMSNorm(nn.Module):
    """Scale each vector to unit root mean square (computed in float32), then by a learned gain."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float()
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * wide.to(x.dtype)


def rope_tables(context: int, head_width: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each position's angles, repeated over both halves of a head: (context, head_width)."""
    inverse = 1.0 / (theta ** (torch.arange(0, head_width, 2, dtype=torch.int64).float() / head_width))
    angles = torch.outer(torch.arange(context, dtype=torch.float32), inverse)
    both = torch.cat([angles, angles], dim=-1)
    return both.cos(), both.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(a, b) -> (-b, a) over the two halves of the last dimension."""
    half = x.size(-1) // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (batch, heads, time, width) by the angles of its positions (`cos`, `sin`: (time, width))."""
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    """Causal grouped-query attention: `n_head` query heads share `n_kv_head` key/value heads."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.kv_heads
        self.head_width = config.n_embd // config.n_head
        self.q_proj = nn.Linear(config.n_embd, self.n_head * self.head_width, bias=False)
        self.k_proj = nn.Linear(config.n_embd, self.n_kv_head * self.head_width, bias=False)
        self.v_proj = nn.Linear(config.n_embd, self.n_kv_head * self.head_width, bias=False)
        self.o_proj = nn.Linear(self.n_head * self.head_width, config.n_embd, bias=False)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerCache | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attention over `x` (batch, time, width); with a cache, over the cached past too (under `mask`)."""
        batch, time, _ = x.shape
        q = self.q_proj(x).view(batch, time, self.n_head, self.head_width).transpose(1, 2)
        k = self.k_proj(x).view(batch, time, self.n_kv_head, self.head_width).transpose(1, 2)
        v = self.v_proj(x).view(batch, time, self.n_kv_head, self.head_width).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # under autocast, rotate in the projections' precision
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        grouped = self.n_kv_head != self.n_head
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0,
                                               enable_gqa=grouped)
        else:  # the kv heads are cached as they are
            k, v = cache.update(k, v)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=grouped)
        return self.o_proj(y.transpose(1, 2).reshape(batch, time, self.n_head * self.head_width))


class SwiGLU(nn.Module):
    """The gated MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.mlp_width, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.mlp_width, bias=False)
        self.down_proj = nn.Linear(config.mlp_width, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm block: attention then MLP, each added to the residual stream."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.n_embd, config.norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = SwiGLU(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerCache | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.drop(self.self_attn(self.input_layernorm(x), cos, sin, cache, mask))
        return x + self.drop(self.mlp(self.post_attention_layernorm(x)))


class Llama(nn.Module):
    """Token embeddings, a stack of blocks, a final RMSNorm and a language-model head (tied to the embeddings or not)."""

    supports_kv_cache = True
    """Generation may pass a `KVCache` to `forward` (see `factory.models.kv_cache`)."""

    def __init__(self, config: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.config = config
        self.vocab_size = vocab_size
        self.embed_tokens = nn.Embedding(vocab_size, config.n_embd)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = rope_tables(config.context, config.n_embd // config.n_head, config.rope_theta)
        self.register_buffer("cos", cos, persistent=False)  # derived from the config: not in the state dict
        self.register_buffer("sin", sin, persistent=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
        for layer in self.layers:  # residual projections scaled down with depth, as the GPT's
            for weight in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight):
                nn.init.normal_(weight, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def num_parameters(self) -> int:
        """Parameters, counting tied weights once."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits for every position of `idx` (batch, time); with a cache, `idx` is the chunk the cache was last fed."""
        time = idx.size(1)
        if cache is None and time > self.config.context:
            raise ValueError(f"sequence of {time} tokens is longer than the model's context ({self.config.context})")
        if cache is not None and cache.end > self.config.context:
            raise ValueError(f"the cache reaches {cache.end} positions, past the model's context ({self.config.context})")
        if cache is None:
            cos, sin = self.cos[:time], self.sin[:time]
        else:  # each row's own positions (left padding shifts them): (batch, 1, time, width)
            cos, sin = self.cos[cache.positions].unsqueeze(1), self.sin[cache.positions].unsqueeze(1)
        x = self.embed_tokens(idx)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin) if cache is None else layer(x, cos, sin, cache.layer(i), cache.mask)
        return self.lm_head(self.norm(x))
