"""The `tokenizer` kind: a byte-level BPE trained on a seeded sample of the blend's train split.

Light to import: its run function imports the tokenizer library (and the blend's streaming loader) when it runs.
"""

from __future__ import annotations

from typing import Any

from factory.config.kinds import TOKENIZER as TOKENIZER_ROLE
from factory.config.kinds import StageKind
from factory.config.schema import Experiment, TokenizerConfig
from factory.config.section import Section
from factory.registry.layout import TOKENIZER_FILE
from factory.runtime.context import WARNINGS, StageContext


class TokenizerSettings(Section):
    """The tokenizer stage: the tokenizer's recipe and how its sample is drawn."""

    tokenizer: TokenizerConfig
    seed: int
    shuffle_buffer_docs: int


def _settings(experiment: Experiment) -> TokenizerSettings:
    return TokenizerSettings(tokenizer=experiment.tokenizer, seed=experiment.seed, shuffle_buffer_docs=experiment.data.shuffle_buffer_docs)


def run(ctx: StageContext) -> dict[str, Any]:
    """Train a byte-level BPE on a seeded sample of the train split."""
    from factory.models.tokenizer import sample_texts, train_tokenizer, vocabulary_shortfall

    config = ctx.settings.tokenizer
    sample = sample_texts(ctx.blend_stream("train", finite=True).texts(), config.sample_bytes)
    tokenizer = train_tokenizer(sample, config)
    tokenizer.save(str(ctx.out / TOKENIZER_FILE))
    sample_bytes = sum(len(t.encode()) for t in sample)
    sample_tokens = sum(len(e.ids) for e in tokenizer.encode_batch(sample[:200]))
    ctx.log.info("trained a %d-token vocabulary on %d files (%d bytes)", tokenizer.get_vocab_size(), len(sample), sample_bytes)
    summary: dict[str, Any] = {
        "vocab_size": tokenizer.get_vocab_size(),
        "sample_files": len(sample),
        "sample_bytes": sample_bytes,
        "bytes_per_token": round(sum(len(t.encode()) for t in sample[:200]) / max(1, sample_tokens), 4),
    }
    if shortfall := vocabulary_shortfall(tokenizer.get_vocab_size(), config, sample_bytes):
        summary[WARNINGS] = shortfall
    return summary


TOKENIZER = StageKind(
    name="tokenizer", run="factory.stages.tokenizer:run", reads=("blend",), present=lambda e: e.base is None, provides=TOKENIZER_ROLE,
    artifact=frozenset({"tokenizers"}), settings=TokenizerSettings, fingerprint=_settings,
    imports=("factory.models.tokenizer", "factory.data.loader"),  # the loader: the blend stream it samples
    description="Byte-level BPE trained on a seeded sample of the blend's train split.",
)
