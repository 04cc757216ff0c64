"""Byte-level BPE tokenizers trained with the `tokenizers` library."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from factory.config.schema import TokenizerConfig
from factory.errors import ArtifactError
from factory.registry.layout import TOKEN_IDS_FILE, TOKENIZER_CONFIG, TOKENIZER_FILE

TOKENIZER_SIDE_FILES = (TOKENIZER_CONFIG, TOKEN_IDS_FILE)
"""Files of a tokenizer artifact (or an exported model) read from beside its tokenizer file, when it has them."""

if TYPE_CHECKING:
    from factory.registry.seam import Registry
    from factory.registry.store import Manifest

EOS = "<|endoftext|>"
SPECIAL_TOKENS = (EOS,)


def sample_texts(texts: Iterable[str], sample_bytes: int) -> list[str]:
    """Whole documents from the front of `texts` until they add up to at least `sample_bytes`."""
    sample, size = [], 0
    for text in texts:
        if size >= sample_bytes:
            break
        sample.append(text)
        size += len(text.encode())
    return sample


def train_tokenizer(texts: Sequence[str], config: TokenizerConfig) -> Tokenizer:
    """Train a byte-level BPE on `texts`; every byte is in the vocabulary, so nothing is unknown."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tokenizer


def vocabulary_shortfall(learned: int, config: TokenizerConfig, sample_bytes: int) -> str | None:
    """What to change when training learned fewer tokens than `vocab_size` asks for (None when it learned them all)."""
    if learned >= config.vocab_size:
        return None
    if sample_bytes < config.sample_bytes:  # the train split is smaller than the sample asked for: only more data helps
        more = f"or add data: the train split gave {sample_bytes:,} of the {config.sample_bytes:,} bytes tokenizer.sample_bytes asks for"
    else:
        more = f"or learn from more data: raise tokenizer.sample_bytes (now {config.sample_bytes:,}) or add datasets"
    return (
        f"the tokenizer learned {learned:,} of the {config.vocab_size:,} tokens tokenizer.vocab_size asks for (its sample has no more "
        f"pairs seen {config.min_frequency}+ times); lower tokenizer.vocab_size to about {learned:,}, {more}"
    )


def load_tokenizer(path: Path) -> Tokenizer:
    """Load a tokenizer saved with `Tokenizer.save`."""
    return Tokenizer.from_file(str(path))


def fetched_tokenizer(registry: Registry, artifact: Manifest) -> Path:
    """The tokenizer file of a published artifact on local disk, with the files read beside it (`TOKENIZER_SIDE_FILES`:
    its config, which `end_of_text` reads, and an imported tokenizer's token ids, which the export reads) that the
    artifact has: those files alone, fetched from an object store, into one directory. ArtifactError when the artifact
    has no tokenizer file."""
    if TOKENIZER_FILE not in artifact.files:
        raise ArtifactError(f"the {artifact.kind} artifact {artifact.digest[:12]} has no {TOKENIZER_FILE}: rerun its stage to publish it again")
    names = [TOKENIZER_FILE, *(name for name in TOKENIZER_SIDE_FILES if name in artifact.files)]
    for _ in range(2):
        places = [registry.fetch(artifact, name) for name in names]
        if len({place.parent for place in places}) == 1:
            return places[0]
        # another process placed a whole copy between two fetches: the next round finds every file in it
    raise ArtifactError(f"the tokenizer files of artifact {artifact.digest[:12]} were fetched into different directories; try again")


def end_of_text(tokenizer: Tokenizer, path: Path) -> int:
    """The id of the token that ends a document: the `eos_token` of the `tokenizer_config.json` beside the tokenizer file
    `path` (a tokenizer imported with a Hugging Face checkpoint, or an exported model's), else EOS."""
    token = EOS
    settings = path.parent / TOKENIZER_CONFIG
    if settings.is_file():
        try:
            named = json.loads(settings.read_text()).get("eos_token", EOS)
        except (OSError, ValueError, AttributeError) as e:
            raise ArtifactError(f"{settings} does not read as a tokenizer config: {e}") from e
        token = named.get("content", EOS) if isinstance(named, dict) else named
    found = tokenizer.token_to_id(token) if isinstance(token, str) else None
    if found is None:
        raise ArtifactError(f"the tokenizer {path} has no end-of-text token {token!r} (named by {settings})")
    return found


def token_byte_lengths(tokenizer: Tokenizer) -> list[int]:
    """Bytes each token id stands for (0 for special tokens); byte-level symbols are one byte each."""
    special = {added.content for added in tokenizer.get_added_tokens_decoder().values() if added.special} | set(SPECIAL_TOKENS)
    lengths = [0] * tokenizer.get_vocab_size()
    for token, index in tokenizer.get_vocab().items():
        lengths[index] = 0 if token in special else len(token)
    return lengths
