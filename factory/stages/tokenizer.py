"""The `tokenizer` kind: a byte-level BPE trained on a seeded sample of the blend's train split, or the tokenizer of the
Hugging Face checkpoint the model starts from (`model.from_hf`), copied as it is.

Light to import: its run function imports the tokenizer library (and the blend's streaming loader) when it runs.
"""

from __future__ import annotations

from typing import Any

from pydantic import SerializerFunctionWrapHandler, model_serializer

from factory.config.kinds import TOKENIZER as TOKENIZER_ROLE
from factory.config.kinds import StageKind
from factory.config.model_section import HFSource
from factory.config.schema import Experiment, TokenizerConfig
from factory.config.section import Section
from factory.registry.layout import TOKENIZER_FILE
from factory.runtime.context import WARNINGS, StageContext


class TokenizerSettings(Section):
    """The tokenizer stage: the tokenizer's recipe and how its sample is drawn."""

    tokenizer: TokenizerConfig = TokenizerConfig()
    seed: int = 0
    shuffle_buffer_docs: int = 0
    from_hf: HFSource | None = None
    """The checkpoint whose tokenizer this is: then nothing else makes its bytes, and nothing else is hashed."""

    @model_serializer(mode="wrap")
    def _only_the_checkpoint(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        if self.from_hf is not None:
            return {"from_hf": self.from_hf.model_dump(mode="json")}
        dump = handler(self)
        dump.pop("from_hf", None)
        return dump


def _settings(experiment: Experiment) -> TokenizerSettings:
    if experiment.model.from_hf is not None:
        return TokenizerSettings(from_hf=experiment.model.from_hf)
    return TokenizerSettings(tokenizer=experiment.tokenizer, seed=experiment.seed, shuffle_buffer_docs=experiment.data.shuffle_buffer_docs)


def _reads(experiment: Experiment) -> tuple[str, ...]:
    return () if experiment.model.from_hf is not None else ("blend",)


def run(ctx: StageContext) -> dict[str, Any]:
    """Train a byte-level BPE on a seeded sample of the train split, or copy the checkpoint's."""
    from factory.models.tokenizer import sample_texts, train_tokenizer, vocabulary_shortfall

    if ctx.settings.from_hf is not None:
        return _imported(ctx)
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


def _imported(ctx: StageContext) -> dict[str, Any]:
    """The tokenizer of the checkpoint the model starts from, with a config naming its end-of-text token."""
    from factory.models.hf_import import copy_tokenizer

    source = ctx.settings.from_hf
    checkpoint = copy_tokenizer(source, ctx.out)
    ctx.log.info("took the %d-token tokenizer of %s (end of text: %s)", checkpoint.vocab_size, checkpoint.root, checkpoint.eos_token)
    return {"vocab_size": checkpoint.vocab_size, "from_hf": str(checkpoint.root), "from_hf_files": checkpoint.digest,
            "eos_token": checkpoint.eos_token}


TOKENIZER = StageKind(
    name="tokenizer", run="factory.stages.tokenizer:run", reads=("blend",), reads_in=_reads, present=lambda e: e.base is None,
    provides=TOKENIZER_ROLE,
    artifact=frozenset({"tokenizers"}), settings=TokenizerSettings, fingerprint=_settings,
    imports=("factory.models.tokenizer", "factory.data.loader"),  # the loader: the blend stream it samples
    description="Byte-level BPE trained on a seeded sample of the blend's train split.",
)
