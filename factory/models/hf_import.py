"""The weights and tokenizer of a Hugging Face Llama checkpoint (`model.from_hf`) as the factory's llama holds them.

`factory.config.hf_checkpoint` checked the directory when the experiment was read; here it is read again and its files
must still be those the stage was planned with. The tensor names are `hf_layout.llama_layout`'s, inverted: the
factory's llama carries Hugging Face's module names, under `model.` there. Weights are read as stored and trained in
fp32 (a bf16 checkpoint widens exactly).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from factory.config.hf_checkpoint import HFCheckpoint, read_checkpoint
from factory.config.model_section import HFSource
from factory.errors import StageFailed
from factory.registry.layout import TOKENIZER_CONFIG, TOKENIZER_FILE

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


def imported_chat_template(source: HFSource) -> str | None:
    """The chat template the checkpoint's tokenizer config carries (an instruction-tuned model's), if any."""
    return planned_checkpoint(source).chat_template


def copy_tokenizer(source: HFSource, directory: Path) -> HFCheckpoint:
    """Put the checkpoint's `tokenizer.json` into `directory`, with a `tokenizer_config.json` naming its end-of-text token."""
    checkpoint = planned_checkpoint(source)
    shutil.copyfile(checkpoint.root / TOKENIZER_FILE, directory / TOKENIZER_FILE)
    settings = checkpoint.root / TOKENIZER_CONFIG
    config = json.loads(settings.read_text()) if settings.is_file() else {}
    config["eos_token"] = checkpoint.eos_token  # where config.json's eos_token_id named it
    (directory / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return checkpoint
