"""`heldout_bpb`: bits per byte on one pinned table version that every experiment is scored on.

`eval.heldout_code@v1` holds Python functions from the code-execution task generator
(`factory.post.tasks.programs`, a fixed seed), those of its test split only (by the hash of the
source, as the task set splits them, so fine-tuning never trains on them), one document each.
Code of this project writes it, so no training blend draws from it and every machine generates
the same bytes; each score records the content it read. `val_bpb` measures each experiment on
its own blend's held-out split, so two experiments' values compare only when they share it;
`heldout_bpb` values compare across experiments.

Heavy imports (pyarrow, torch) wait until the table is written or scored, so reading the
benchmark registry stays light.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import sys
from typing import TYPE_CHECKING

from factory.errors import ArtifactError, ConfigError
from factory.evals.base import EvalInputs, Score

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog

    from factory.data.tables import TableVersion

TABLE = "eval.heldout_code"
TAG = "v1"
REF = f"{TABLE}@{TAG}"
PROGRAMS = 4000
"""Functions generated: 115 fall in the test split (12.5 kB); more would add only `conditional` ones, every other family
has run out of new functions by then."""
SEED = 0
SOURCE = "factory.post.tasks"


@functools.lru_cache(maxsize=1)
def heldout_documents(programs: int = PROGRAMS, seed: int = SEED) -> pa.Table:
    """The test-split functions of `programs` seeded generated ones, as documents (the dataset schema); generated once
    per process (two thirds of a second), which writes the corpus into each new root's catalog."""
    import pyarrow as pa

    from factory.data.documents import ARROW_SCHEMA, doc_id
    from factory.post.tasks import programs as generated
    from factory.post.tasks import split_of

    rows = []
    for program in generated(programs, seed):
        if split_of(program.source) != "test":
            continue
        sha = hashlib.sha256(program.source.encode()).hexdigest()
        path = f"{program.family}/{sha[:16]}.py"
        rows.append({
            "id": doc_id(SOURCE, path), "source": SOURCE, "path": path, "text": program.source, "bytes": len(program.source.encode()),
            "sha256": sha, "metadata": json.dumps({"family": program.family, "difficulty": program.difficulty, "seed": seed}),
        })
    return pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)


def write_heldout_corpus(catalog: Catalog, log: logging.Logger) -> TableVersion:
    """Write the corpus as `eval.heldout_code@v1`; the same bytes every time, so a second write reuses the version."""
    from factory.data.tables import write_version

    return write_version(catalog, TABLE, heldout_documents(), log, tag=TAG)


def heldout_texts(catalog: Catalog) -> list[str]:
    """Every document of the pinned version, in id order; a clear error when it was never generated."""
    from factory.data.tables import read_version, resolve

    try:
        snapshot = resolve(catalog, TABLE, TAG)
    except ArtifactError as e:
        raise ArtifactError(f"{e}: materialize the heldout_corpus asset (group evals), which an evaluation of heldout_bpb does first") from e
    return read_version(catalog, TABLE, snapshot, columns=("id", "text"))["text"].to_pylist()


def heldout_bpb(inputs: EvalInputs) -> Score:
    """Bits per byte of every document of `eval.heldout_code@v1`, each followed by EOS, scored in windows of the context."""
    from factory.evals.bpb import bits_per_byte, validation_tokens
    from factory.models.tokenizer import token_byte_lengths

    if inputs.catalog is None:
        raise ConfigError("the heldout_bpb benchmark needs the Iceberg catalog; it was not given one")
    texts = heldout_texts(inputs.catalog)
    tokens = validation_tokens(texts, inputs.tokenizer, inputs.eos_id, max_bytes=sys.maxsize)
    result = bits_per_byte(inputs.model, tokens, token_byte_lengths(inputs.tokenizer), inputs.context, inputs.batch_size)
    details = {"table": REF, "documents": len(texts), "tokens": result.tokens, "bytes": result.bytes}
    return Score(value=result.bpb, count=result.bytes, details=details)
