"""The weights and tokenizer of a Hugging Face Llama checkpoint (`model.from_hf`) as the factory's llama holds them.

`factory.config.hf_checkpoint` checked the directory when the experiment was read; here it is read again and its files
must still be those the stage was planned with. The tensor names are `hf_layout.llama_layout`'s, inverted: the
factory's llama carries Hugging Face's module names, under `model.` there. Weights are read as stored and trained in
fp32 (a bf16 checkpoint widens exactly). The tokenizer is copied with what the exported model must say again: its
tokenizer config (special tokens, `add_bos_token`, ...) and the special token ids of `config.json` and
`generation_config.json`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from factory.config.hf_checkpoint import HFCheckpoint, read_checkpoint, read_json
from factory.config.model_section import HFSource
from factory.errors import StageFailed
from factory.models.hf_export import write_json
from factory.registry.layout import GENERATION_CONFIG, MODEL_CONFIG, TOKEN_IDS_FILE, TOKENIZER_CONFIG, TOKENIZER_FILE

HF_PREFIX = "model."
HEAD = "lm_head.weight"
EMBEDDING = "embed_tokens.weight"


def planned_checkpoint(source: HFSource) -> HFCheckpoint:
    """The checkpoint `source` names, refused when its files changed since the stage was planned."""
    checkpoint = read_checkpoint(source.path)
    if checkpoint.digest != source.files:
        raise StageFailed(f"the files of {checkpoint.root} (model.from_hf) changed after this stage was planned; run it again")
    return checkpoint


def import_weights(source: HFSource) -> dict[str, torch.Tensor]:
    """The checkpoint's weights by the factory's llama names, in fp32 (a tied head is the embedding)."""
    checkpoint = planned_checkpoint(source)
    weights: dict[str, torch.Tensor] = {}
    for file in sorted(set(checkpoint.tensors.values())):
        for name, tensor in load_file(checkpoint.root / file).items():
            if name in checkpoint.tensors:
                weights[name.removeprefix(HF_PREFIX)] = tensor.to(torch.float32)
    if HEAD not in weights:  # tied: the head is the embedding
        weights[HEAD] = weights[EMBEDDING]
    return weights


def copy_tokenizer(source: HFSource, directory: Path) -> HFCheckpoint:
    """Put the checkpoint's `tokenizer.json` into `directory`, with its `tokenizer_config.json` (naming its end-of-text
    token where only `config.json`'s `eos_token_id` did) and its special token ids (`token_ids.json`)."""
    checkpoint = planned_checkpoint(source)
    shutil.copyfile(checkpoint.root / TOKENIZER_FILE, directory / TOKENIZER_FILE)
    settings = checkpoint.root / TOKENIZER_CONFIG
    config = read_json(settings) if settings.is_file() else {}
    config["eos_token"] = config.get("eos_token") or checkpoint.eos_token
    write_json(directory / TOKENIZER_CONFIG, config)
    write_json(directory / TOKEN_IDS_FILE, {name: token_ids(checkpoint.root / name)
                                             for name in (MODEL_CONFIG, GENERATION_CONFIG) if (checkpoint.root / name).is_file()})
    return checkpoint


def token_ids(path: Path) -> dict[str, object]:
    """The special token ids a `config.json` or `generation_config.json` gives (`bos_token_id`, `eos_token_id` (an id or a
    list of them), `pad_token_id`, ...)."""
    return {key: value for key, value in read_json(path).items() if key.endswith("_token_id")}
