"""Hugging Face checkpoint directories as a user brings them: a random-initialised `LlamaForCausalLM` saved by
`transformers` itself, with a byte-level BPE whose end-of-text token is Llama's `</s>`, not the factory's; or, as an
instruction-tuned model, with four distinct special tokens and a ChatML chat template. And an experiment file that
starts from one, with code to pretrain on and chats to fine-tune on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never a download: everything is built here
import transformers  # noqa: E402  (after the offline switch)

TEXTS = [f"def f{i}(x):\n    return x * {i} + {i * i}  # {'odd' if i % 2 else 'even'}\n" for i in range(300)]
VOCAB = 320
LLAMA_TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}
CHAT_TOKENS = {"bos_token": "<s>", "eos_token": "<|im_end|>", "pad_token": "<pad>", "unk_token": "<unk>"}
"""Four distinct special tokens, as an instruction-tuned model has them (SmolLM2's turns end with `<|im_end|>`)."""
CHATML = ("{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tokenizer(vocab: int = VOCAB, special: tuple[str, ...] = tuple(LLAMA_TOKENS.values())) -> Tokenizer:
    """A byte-level BPE of `vocab` tokens with the `special` tokens (Llama's by default)."""
    built = Tokenizer(models.BPE())
    built.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    built.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(special), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    built.train_from_iterator(TEXTS, trainer=trainer)
    assert built.get_vocab_size() == vocab, built.get_vocab_size()
    return built


def save_llama(directory: Path, *, tie: bool = False, kv_heads: int = 2, seed: int = 0, vocab: int = VOCAB,
               dtype: torch.dtype = torch.float32, chat: bool = False) -> transformers.LlamaForCausalLM:
    """Save a random `LlamaForCausalLM` (2 layers, 64 wide) and its tokenizer into `directory` with `save_pretrained`;
    `chat`: with `CHAT_TOKENS` (their ids in `config.json` and `generation_config.json`), the ChatML template in
    `chat_template.jinja`, and `add_bos_token` in the tokenizer config as `transformers` 4 wrote it."""
    tokens = CHAT_TOKENS if chat else LLAMA_TOKENS
    built = tokenizer(vocab, (*tokens.values(), *(("<|im_start|>",) if chat else ())))
    ids = {key.replace("_token", "_token_id"): built.token_to_id(token) for key, token in tokens.items() if key != "unk_token"}
    config = transformers.LlamaConfig(
        vocab_size=built.get_vocab_size(), hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=kv_heads, max_position_embeddings=128, tie_word_embeddings=tie, rope_theta=5000.0, rms_norm_eps=1e-6, **ids,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(dtype)
    model.save_pretrained(directory)
    saved = transformers.PreTrainedTokenizerFast(tokenizer_object=built, **tokens)
    if chat:
        saved.chat_template = CHATML
    saved.save_pretrained(directory)
    if chat:
        settings = directory / "tokenizer_config.json"
        settings.write_text(json.dumps({**json.loads(settings.read_text()), "add_bos_token": False}, indent=2))
    return model


IMPORTED = """---
seed: 3
data:
  datasets:
    code:
      source: {{kind: directory, path: {root}/code, include: ["*.py"]}}
    chat:
      source: {{kind: directory, path: {root}/chats, include: ["*.jsonl"], format: jsonl, columns: [messages]}}
  blend: [{{dataset: code, weight: 1}}]
  validation_percent: 20
model:
  from_hf: {root}/hf
  context: 64
{training}
---
A Llama checkpoint `transformers` saved, {what}.
"""
"""An experiment file importing the checkpoint `root/hf`, with its training sections (`training`) and prose (`what`)."""


def write_sources(root: Path, files: int = 40) -> None:
    """The files `IMPORTED` reads: `files` modules of code under `root/code`, and chats under `root/chats`."""
    from tests.stages.test_sft_data import CHATS

    (root / "code").mkdir()
    for i in range(files):
        (root / "code" / f"m{i}.py").write_text("".join(TEXTS[i * 7 : i * 7 + 7]) * 3)
    (root / "chats").mkdir()
    (root / "chats" / "chats.jsonl").write_text("".join(json.dumps({"messages": chat}) + "\n" for chat in CHATS))
