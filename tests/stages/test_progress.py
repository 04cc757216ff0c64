"""The training progress bar: drawn when the launcher says stderr is a terminal, absent otherwise; and the data stages'
progress in parts (files ingested, documents signed), in their log and on a terminal."""

import io
import logging

import pytest

from factory.launch.local import PROGRESS_ENV
from factory.config.data_sections import DedupConfig, SourceConfig
from factory.data import minhash
from factory.data.dedup import deduplicate
from factory.data.ingest import read_documents
from factory.runtime.progress import training_progress, wants_progress, work_progress
from tests.data.conftest import documents


def test_the_bar_shows_step_loss_and_throughput():
    screen = io.StringIO()
    with training_progress("pretrain", 10, enabled=True, file=screen) as update:
        for step in range(1, 11):
            update(step, 2.0 / step, 12_345.0)
    drawn = screen.getvalue()
    assert "pretrain" in drawn and "10/10" in drawn
    assert "loss 0.2000" in drawn and "12,345 tok/s" in drawn
    assert "\x1b[" in drawn  # drawn for a terminal


def test_no_bar_unless_asked_and_never_for_several_ranks(monkeypatch):
    with training_progress("pretrain", 10, enabled=False) as update:
        assert update is None
    monkeypatch.setenv(PROGRESS_ENV, "1")
    assert wants_progress(1) and not wants_progress(2)
    monkeypatch.setenv(PROGRESS_ENV, "0")
    assert not wants_progress(1)


def test_work_in_parts_is_logged_at_most_so_often_and_always_at_its_end(caplog):
    log = logging.getLogger("test.progress")
    with caplog.at_level(logging.INFO, logger=log.name):
        with work_progress("code: ingest", "files", log, enabled=False, every_s=3600) as part_done:
            for done in range(1, 6):
                part_done(done, 5)
        assert [r.getMessage() for r in caplog.records] == ["code: ingest: 1 of 5 files (20%)", "code: ingest: 5 of 5 files (100%)"]
        caplog.clear()
        with work_progress("code: near dedup", "documents signed", log, enabled=False, every_s=0) as part_done:
            part_done(2, 3), part_done(3, 3)
        assert [r.getMessage() for r in caplog.records] == ["code: near dedup: 2 of 3 documents signed (67%)",
                                                            "code: near dedup: 3 of 3 documents signed (100%)"]
    screen = io.StringIO()
    with work_progress("code: ingest", "files", log, enabled=True, file=screen) as part_done:
        part_done(7, 7)
    assert "code: ingest" in screen.getvalue() and "7/7" in screen.getvalue() and "\x1b[" in screen.getvalue()


def test_ingest_and_near_dedup_say_each_part_they_finish(tmp_path, monkeypatch):
    for n in range(5):
        (tmp_path / f"f{n}.py").write_text(f"def f{n}():\n    return {n}\n" * (n + 1))
    (tmp_path / "bad.py").write_bytes(b"\0binary")
    heard = []
    source = SourceConfig(kind="directory", path=str(tmp_path))
    monkeypatch.setenv("FACTORY_DATA_ROOTS", str(tmp_path))
    with read_documents("code", source, logging.getLogger("test"), lambda done, total: heard.append((done, total))) as result:
        assert heard == [(n, 6) for n in range(1, 7)] and result.documents.keys.num_rows == 5  # a skipped file is done too

    shared = "".join(f"row_{i} = compute({i}, twice=True)\n" for i in range(40))
    table = documents("code", {f"m{n}.py": shared + f"last = {n}\n" if n % 2 else f"other_{n} = {n}\n" * (n + 1) for n in range(7)})
    config = DedupConfig(num_perm=16, near_threshold=0.5)
    whole = deduplicate(table, config, 3, logging.getLogger("test"))
    monkeypatch.setattr(minhash, "CHUNK_DOCUMENTS", 3)
    heard.clear()
    parted = deduplicate(table, config, 3, logging.getLogger("test"), lambda done, total: heard.append((done, total)))
    assert heard == [(3, 7), (6, 7), (7, 7)]
    assert parted.documents["id"].to_pylist() == whole.documents["id"].to_pylist() and whole.near_removed > 0
