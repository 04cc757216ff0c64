"""A trained model written as a Hugging Face model directory, with safetensors and json only (no `transformers` needed).

The directory `transformers.AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained` load:
`config.json` (the layout's fields, the token ids, and the factory's own record of the run beside them, which
`transformers` keeps as extra attributes), `model.safetensors` by Hugging Face names, `tokenizer.json` (the factory's
byte-level BPE as the `tokenizers` library saved it), `tokenizer_config.json` (special tokens, the chat template of a
model fine-tuned with one) and `generation_config.json`. A tokenizer imported with a checkpoint (`model.from_hf`)
keeps what the checkpoint said of it: its tokenizer config and the special token ids of its `config.json` and
`generation_config.json` are written again as they were. `model.pt` (the factory's names) stays beside them: the
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
    GENERATION_CONFIG, MODEL_CONFIG, MODEL_SAFETENSORS, MODEL_WEIGHTS, TOKEN_IDS_FILE, TOKENIZER_CONFIG, TOKENIZER_FILE,
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
    the fields of `config.json`. The token settings are those the tokenizer was imported with (`imported_tokens`), else
    the factory's."""
    torch.save(weights, directory / MODEL_WEIGHTS)
    stored = {name: tensor.contiguous() for name, tensor in layout.tensors.items()}
    (directory / MODEL_SAFETENSORS).write_bytes(sorted_header(save_safetensors(stored, metadata={"format": "pt"})))
    shutil.copyfile(tokenizer, directory / TOKENIZER_FILE)
    ids, generation_ids, settings = imported_tokens(tokenizer) or factory_tokens(tokenizer, context)
    settings = {key: value for key, value in settings.items() if key != "chat_template"}  # the model's own, below
    if chat_template is not None:
        settings["chat_template"] = chat_template
    dtype = str(next(t.dtype for t in stored.values() if t.is_floating_point())).removeprefix("torch.")
    config = {**record, **layout.config, **ids, "architectures": [layout.architecture], "torch_dtype": dtype, "dtype": dtype}
    write_json(directory / MODEL_CONFIG, config)
    write_json(directory / GENERATION_CONFIG, {**generation_ids, "do_sample": False})
    write_json(directory / TOKENIZER_CONFIG, settings)


TokenSettings = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]
"""The special token ids of `config.json` and of `generation_config.json`, and `tokenizer_config.json`."""


def imported_tokens(tokenizer: Path) -> TokenSettings | None:
    """What a tokenizer imported with a checkpoint keeps beside it (`factory.models.hf_import.copy_tokenizer`): the
    checkpoint's token ids (those of `config.json` where it had no `generation_config.json`) and tokenizer config; None
    for a tokenizer the factory trained."""
    ids_file = tokenizer.parent / TOKEN_IDS_FILE
    if not ids_file.is_file():
        return None
    ids = json.loads(ids_file.read_text())
    model_ids = ids.get(MODEL_CONFIG, {})
    return model_ids, ids.get(GENERATION_CONFIG, model_ids), json.loads((tokenizer.parent / TOKENIZER_CONFIG).read_text())


def factory_tokens(tokenizer: Path, context: int) -> TokenSettings:
    """The factory's token settings: its end-of-text token starts, ends and pads (no separate start token: documents are
    separated by it, GPT-2's way)."""
    vocabulary = load_tokenizer(tokenizer)
    eos = end_of_text(vocabulary, tokenizer)
    ids = {"bos_token_id": eos, "eos_token_id": eos}
    return ids, {**ids, "pad_token_id": eos}, tokenizer_config(context, vocabulary.id_to_token(eos))


def tokenizer_config(context: int, eos: str = EOS) -> dict[str, Any]:
    """`tokenizer_config.json` of a tokenizer the factory trained: the generic fast tokenizer over `tokenizer.json`, adding
    no tokens of its own, the end-of-text token `eos` as every special token GPT-2 names."""
    return {
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


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """`data` as sorted, indented json (the same bytes for the same data)."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
