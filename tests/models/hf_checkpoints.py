"""Hugging Face checkpoint directories as a user brings them: a random-initialised `LlamaForCausalLM` saved by
`transformers` itself, with a byte-level BPE whose end-of-text token is Llama's `</s>`, not the factory's."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never a download: everything is built here
import transformers  # noqa: E402  (after the offline switch)

TEXTS = [f"def f{i}(x):\n    return x * {i} + {i * i}  # {'odd' if i % 2 else 'even'}\n" for i in range(300)]
VOCAB = 320


def tokenizer(vocab: int = VOCAB) -> Tokenizer:
    """A byte-level BPE of `vocab` tokens with Llama's special tokens."""
    built = Tokenizer(models.BPE())
    built.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    built.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    built.train_from_iterator(TEXTS, trainer=trainer)
    assert built.get_vocab_size() == vocab, built.get_vocab_size()
    return built


def save_llama(directory: Path, *, tie: bool = False, kv_heads: int = 2, seed: int = 0, vocab: int = VOCAB,
               dtype: torch.dtype = torch.float32) -> transformers.LlamaForCausalLM:
    """Save a random `LlamaForCausalLM` (2 layers, 64 wide) and its tokenizer into `directory` with `save_pretrained`."""
    built = tokenizer(vocab)
    config = transformers.LlamaConfig(
        vocab_size=built.get_vocab_size(), hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=kv_heads, max_position_embeddings=128, tie_word_embeddings=tie, rope_theta=5000.0, rms_norm_eps=1e-6,
        bos_token_id=built.token_to_id("<s>"), eos_token_id=built.token_to_id("</s>"),
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(dtype)
    model.save_pretrained(directory)
    transformers.PreTrainedTokenizerFast(tokenizer_object=built, bos_token="<s>", eos_token="</s>").save_pretrained(directory)
    return model
