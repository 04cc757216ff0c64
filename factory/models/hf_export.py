"""A trained model written as a Hugging Face model directory, with safetensors and json only (no `transformers` needed).

The directory `transformers.AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained` load:
`config.json` (the layout's fields, the token ids, and the factory's own record of the run beside them, which
`transformers` keeps as extra attributes), `model.safetensors` by Hugging Face names, `tokenizer.json` (the factory's
byte-level BPE as the `tokenizers` library saved it), `tokenizer_config.json` (special tokens, the chat template of a
model fine-tuned with one) and `generation_config.json`. `model.pt` (the factory's names) stays beside them: the
stages downstream load it. Every file is the same bytes for the same weights.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as save_safetensors

from factory.models.export import sorted_header
from factory.models.hf_layout import HFLayout
from factory.models.tokenizer import EOS, end_of_text, load_tokenizer
from factory.registry.layout import (
    GENERATION_CONFIG, MODEL_CONFIG, MODEL_SAFETENSORS, MODEL_WEIGHTS, TOKENIZER_CONFIG, TOKENIZER_FILE,
)


def export_hugging_face(
    layout: HFLayout,
    weights: Mapping[str, torch.Tensor],
    directory: Path,
    *,
    tokenizer: Path,
    context: int,
    record: Mapping[str, Any],
    chat_template: str | None = None,
) -> None:
    """Write the Hugging Face directory of `layout` into `directory`; `record` (the factory's account of the run) joins
    the fields of `config.json`."""
    torch.save(weights, directory / MODEL_WEIGHTS)
    stored = {name: tensor.contiguous() for name, tensor in layout.tensors.items()}
    (directory / MODEL_SAFETENSORS).write_bytes(sorted_header(save_safetensors(stored, metadata={"format": "pt"})))
    shutil.copyfile(tokenizer, directory / TOKENIZER_FILE)
    vocabulary = load_tokenizer(tokenizer)
    eos = end_of_text(vocabulary, tokenizer)  # the checkpoint's own when the tokenizer was imported with one
    ids = {"bos_token_id": eos, "eos_token_id": eos}  # no separate start token: documents are separated by EOS (GPT-2's way)
    dtype = str(next(t.dtype for t in stored.values() if t.is_floating_point())).removeprefix("torch.")
    config = {**record, **layout.config, **ids, "architectures": [layout.architecture], "torch_dtype": dtype, "dtype": dtype}
    _write_json(directory / MODEL_CONFIG, config)
    _write_json(directory / GENERATION_CONFIG, {**ids, "pad_token_id": eos, "do_sample": False})
    _write_json(directory / TOKENIZER_CONFIG, tokenizer_config(context, chat_template, vocabulary.id_to_token(eos)))


def tokenizer_config(context: int, chat_template: str | None, eos: str = EOS) -> dict[str, Any]:
    """`tokenizer_config.json`: the generic fast tokenizer over `tokenizer.json`, adding no tokens of its own, the
    end-of-text token `eos` as every special token GPT-2 names, and the chat template when there is one."""
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": eos,
        "eos_token": eos,
        "unk_token": eos,
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    return config


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
