"""Near dedup on Daft against datasketch, the reference: the same signatures value for value, the same documents
removed as datasketch's LSH visited in id order, whatever the number of partitions."""

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasketch import MinHash

from factory.config.data_sections import DedupConfig
from factory.data.dedup import reference_near_duplicates, shingles
from factory.data import minhash
from factory.data.minhash import _signature_batch, _signed, kept_signatures, near_duplicates, signatures
from tests.data.conftest import documents

STDLIB = Path(sysconfig.get_paths()["stdlib"])
REPO = Path(__file__).resolve().parents[2]
EDGES = {"empty.py": "", "one.py": "x", "short.py": "a b c", "five.py": "one two three four five", "six.py": "1 2 3 4 5 6",
         "unicode.py": "def grüße(naïve, 東京):\n    return naïve + 東京  # ünïcode wörds\n", "spaces.py": "\t a  =\n\n b(c)\r\n",
         "no-words.py": "!!! ???\n", "marks.py": "nai\u0308ve cafe\u0301 x² y ½ हिन्दी text می\u200cخواهم ok_1",
         "astral.py": "𝐀𝐁 x\0y 😀 z"}
"""Texts at the edges of what a word is: none, fewer than five, exactly five, six; letters with combining marks
(Python's `\\w` has no marks: they split a word), numbers such as ² and ½ (Python's `\\w` has them), a joiner inside
a word, characters outside the basic plane, a NUL."""


def corpus() -> dict[str, str]:
    """Real files of the standard library, each fifth one again under another name with one line changed."""
    paths = sorted((STDLIB / "json").rglob("*.py")) + sorted((STDLIB / "email").rglob("*.py"))
    texts = {str(path.relative_to(STDLIB)): path.read_text(errors="replace") for path in paths}
    for name, text in list(texts.items())[::5]:
        lines = text.splitlines(keepends=True)
        lines[len(lines) // 2] = "changed = True\n"
        texts[f"copies/{name}"] = "".join(lines)
    return texts


def signed_as_datasketch_signs(texts: dict[str, str], tokens: int) -> None:
    table = documents("code", texts)
    config = DedupConfig(num_perm=32, shingle_tokens=tokens)
    signed = signatures(table, config, seed=7)
    for document, text in zip(table["id"].to_pylist(), table["text"].to_pylist(), strict=True):
        sketch = MinHash(num_perm=32, seed=7)
        sketch.update_batch(shingles(text, tokens))
        assert signed[document] == sketch.hashvalues.tolist(), text[:200]


@pytest.mark.parametrize("tokens", [1, 5])
def test_the_engines_signatures_are_datasketchs_value_for_value(tokens):
    signed_as_datasketch_signs({**corpus(), **EDGES}, tokens)


class Batch:
    """A batch of rows as the engine hands it to a batch function (what `to_arrow` gives)."""

    def __init__(self, rows: pa.Array) -> None:
        self.rows = rows

    def to_arrow(self) -> pa.Array:
        return self.rows


def datasketchs(text: str | None, num_perm: int, seed: int) -> list[int] | None:
    if text is None:
        return None
    sketch = MinHash(num_perm=num_perm, seed=seed)
    sketch.update_batch(shingles(text, 5))
    return sketch.hashvalues.tolist()


@pytest.mark.parametrize("rows", [["gone", " a b c d e f g ", None, "", "x y", "one two three four five six"],
                                  ["gone", "a b c d e f", "x"]], ids=["with a row of no text", "every row with text"])
def test_a_batch_is_signed_as_datasketch_signs_it_even_when_it_is_a_slice_of_a_longer_array(rows):
    """What the engine hands the batch function: each row's words, one space between two (one may lead, one trail)."""
    signed = _signature_batch(Batch(pa.array(rows, pa.large_string()).slice(1)), 5, 16, 7).to_pylist()
    assert signed == [datasketchs(text, 16, 7) for text in rows[1:]]


def test_signatures_made_in_small_chunks_three_at_once_are_those_made_in_one():
    table = documents("code", {**corpus(), **EDGES})
    config = DedupConfig(num_perm=32)
    assert signatures(table, config, seed=7, chunk=5, at_once=3) == signatures(table, config, seed=7, at_once=1)


def test_the_signatures_wait_for_the_bands_in_files_under_the_scratch_directory_removed_at_the_end(monkeypatch, tmp_path):
    """On this machine the stage keeps no signature: the chunks' go to Parquet files under its scratch directory as they
    are made (a file once it would hold SPILL_ROWS of them), which the bands read; the files hold every document's
    signature, and are gone when near dedup ends."""
    monkeypatch.setattr(minhash, "SPILL_ROWS", 12)  # chunks of 5: three to a file
    table = documents("code", corpus())
    config = DedupConfig(num_perm=32)
    with kept_signatures(tmp_path) as kept:
        _signed(table, config, 7, kept.add, chunk=5, at_once=2)
        read = kept.frame().to_pydict()
        files = {path.name: pq.read_metadata(path).num_rows for path in kept.directory.iterdir()}
        assert kept.directory.parent == tmp_path
    assert files == {f"{n:08d}.parquet": min(15, table.num_rows - 15 * n) for n in range(-(-table.num_rows // 15))}
    assert {document: [read[f"p{i}"][row] for i in range(32)] for row, document in enumerate(read["id"])} == signatures(table, config, seed=7)
    assert list(tmp_path.iterdir()) == []


SHORT = {name: EDGES[name] for name in ("empty.py", "one.py", "short.py", "five.py", "spaces.py")}
"""Documents of at most five words: each is one shingle of all its words."""


@pytest.mark.parametrize("texts", [SHORT, {"one.py": "x = y"}], ids=["short documents only", "one document"])
def test_a_chunk_of_short_documents_or_of_one_document_is_signed_as_datasketch_signs_it(texts):
    """The engine hands such a chunk's shingle hashes back in one piece, which Arrow lends read-only: the compiled loop
    is given a copy."""
    signed_as_datasketch_signs(texts, 5)


ON_THREADS = """
import json, os, sys
import daft
daft.set_runner_native(num_threads=int(sys.argv[1]))
daft.set_execution_config(default_morsel_size=256)  # many small batches, finished in whatever order the threads go
from factory.config.data_sections import DedupConfig
from factory.data.minhash import near_duplicates
from tests.data.conftest import documents
from tests.data.test_minhash import EDGES, corpus
threads = int(sys.argv[1])  # as many chunks of 7 documents signed at once
removed = near_duplicates(documents("code", {**corpus(), **EDGES}), DedupConfig(near_threshold=0.7), 0, chunk=7, at_once=threads)
print(json.dumps(sorted(removed)), flush=True)
os._exit(0)  # as a stage ends (`exit_now`): Daft's native threads can abort the interpreter's finalization
"""


def test_near_dedup_removes_what_datasketchs_lsh_removes_on_1_2_and_4_threads():
    """On Daft's runner with 1, 2 and 4 threads, signing as many chunks of 7 documents at once."""
    table = documents("code", {**corpus(), **EDGES})
    expected = reference_near_duplicates(table, DedupConfig(near_threshold=0.7), seed=0)
    assert len(expected) >= 5, "the corpus has near duplicates to find"
    assert near_duplicates(table, DedupConfig(near_threshold=0.7), 0) == expected
    for threads in (1, 2, 4):
        run = subprocess.run([sys.executable, "-c", ON_THREADS, str(threads)], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        assert set(json.loads(run.stdout)) == expected, threads
