"""The built-in architectures in Hugging Face layouts: the `config.json` fields and tensor names `transformers` expects.

`llama` is `LlamaForCausalLM` (its modules carry Hugging Face's names already, under `model.`); `gpt` with learned
positions is `GPT2LMHeadModel` (GPT-2's `Conv1D` layers hold their weights transposed, (in, out)). A GPT with rotary
positions has no Hugging Face architecture that computes it: its layout is a line saying so. Pure functions of the
config and the weights: writing them is `factory.models.hf_export`'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from factory.config.schema import ModelConfig

NO_LAYOUT_ROTARY_GPT = (
    "a gpt with rotary positions has no Hugging Face architecture; arch llama (LlamaForCausalLM) and arch gpt with "
    "learned positions (GPT2LMHeadModel) export one, so the model directory holds the factory's own files only"
)
INITIALIZER_RANGE = 0.02
LAYER_NORM_EPS = 1e-5
"""The GPT's nn.LayerNorm epsilon (torch's default)."""


@dataclass(frozen=True, kw_only=True)
class HFLayout:
    """A model as `transformers` loads it: the fields of its `config.json` (token ids aside) and its tensors by name."""

    architecture: str
    """The class `config.json`'s `architectures` names (`LlamaForCausalLM`)."""
    config: dict[str, object]
    tensors: dict[str, torch.Tensor]


def llama_layout(config: ModelConfig, weights: Mapping[str, torch.Tensor], vocab_size: int) -> HFLayout:
    """A llama as `LlamaForCausalLM`: its tensors under `model.` (the head outside it, left out when tied)."""
    tensors = {("" if name == "lm_head.weight" else "model.") + name: tensor for name, tensor in weights.items()}
    if config.tie_embeddings:
        tensors.pop("lm_head.weight", None)
    fields: dict[str, object] = {
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": config.n_embd,
        "intermediate_size": config.mlp_width,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.n_embd // config.n_head,
        "hidden_act": "silu",
        "max_position_embeddings": config.context,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,  # transformers 4 reads this key, 5 reads rope_parameters
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "attention_bias": False,
        "attention_dropout": config.dropout,
        "mlp_bias": False,
        "pretraining_tp": 1,
    }
    return HFLayout(architecture="LlamaForCausalLM", config=_common(config, fields), tensors=tensors)


GPT2_NAMES = (  # factory name -> GPT-2 name, and whether the weight is a Conv1D's (stored transposed)
    (re.compile(r"wte\.weight"), r"transformer.wte.weight", False),
    (re.compile(r"wpe\.weight"), r"transformer.wpe.weight", False),
    (re.compile(r"ln_f\.(weight|bias)"), r"transformer.ln_f.\1", False),
    (re.compile(r"lm_head\.weight"), r"lm_head.weight", False),
    (re.compile(r"blocks\.(\d+)\.(ln_[12])\.(weight|bias)"), r"transformer.h.\1.\2.\3", False),
    (re.compile(r"blocks\.(\d+)\.attn\.qkv\.(weight|bias)"), r"transformer.h.\1.attn.c_attn.\2", True),
    (re.compile(r"blocks\.(\d+)\.attn\.proj\.(weight|bias)"), r"transformer.h.\1.attn.c_proj.\2", True),
    (re.compile(r"blocks\.(\d+)\.mlp\.0\.(weight|bias)"), r"transformer.h.\1.mlp.c_fc.\2", True),
    (re.compile(r"blocks\.(\d+)\.mlp\.2\.(weight|bias)"), r"transformer.h.\1.mlp.c_proj.\2", True),
)


def gpt2_layout(config: ModelConfig, weights: Mapping[str, torch.Tensor], vocab_size: int) -> HFLayout | str:
    """A GPT with learned positions as `GPT2LMHeadModel` (exact GELU: `activation_function` "gelu", not GPT-2's
    tanh approximation); a GPT with rotary positions has none, and the line says which architectures export."""
    if config.positions != "learned":
        return NO_LAYOUT_ROTARY_GPT
    tensors = {}
    for name, tensor in weights.items():
        new, conv = _gpt2_name(name)
        if new == "lm_head.weight" and config.tie_embeddings:
            continue
        tensors[new] = tensor.t() if conv and tensor.dim() == 2 else tensor
    fields: dict[str, object] = {
        "model_type": "gpt2",
        "vocab_size": vocab_size,
        "n_positions": config.context,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": 4 * config.n_embd,
        "activation_function": "gelu",
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "scale_attn_weights": True,
    }
    return HFLayout(architecture="GPT2LMHeadModel", config=_common(config, fields), tensors=tensors)


def _gpt2_name(name: str) -> tuple[str, bool]:
    """The GPT-2 name of a factory GPT tensor, and whether it is a Conv1D weight (transposed)."""
    for pattern, replacement, conv in GPT2_NAMES:
        if pattern.fullmatch(name):
            return pattern.sub(replacement, name), conv
    raise ValueError(f"no GPT-2 name for the tensor {name!r}: is this a factory GPT's state dict?")


def _common(config: ModelConfig, fields: dict[str, object]) -> dict[str, object]:
    """The fields every layout's `config.json` has besides its own."""
    return {
        **fields,
        "tie_word_embeddings": config.tie_embeddings,
        "initializer_range": INITIALIZER_RANGE,
        "use_cache": True,
    }
