"""Exact and near-duplicate removal with real datasketch MinHash LSH."""

from factory.config.data_sections import DedupConfig
from factory.data.dedup import deduplicate, shingles
from factory.data.documents import doc_id
from tests.data.conftest import LOG, documents

SEED = 0


def long_file(lines: int = 200) -> str:
    return "".join(f"total_{i} = compute(item_{i * 7 % 13}, weight_{i % 5}, {i})\n" for i in range(lines))


def other_file(lines: int = 200) -> str:
    return "".join(f"def handler_{i}(request):\n    return render(request, 'page_{i}.html')\n" for i in range(lines))


def first_by_id(source: str, *paths: str) -> str:
    return min(paths, key=lambda p: doc_id(source, p))


def test_exact_duplicates_keep_the_first_id():
    paths = ("a.py", "b.py", "c.py")
    table = documents("code", {"a.py": "x = 1\n", "b.py": "x = 1\n", "c.py": "x = 1\n", "d.py": "y = 2\n"})
    result = deduplicate(table, DedupConfig(near_threshold=None), SEED, LOG)
    assert result.exact_removed == 2
    assert result.near_removed == 0
    assert set(result.documents["path"].to_pylist()) == {first_by_id("code", *paths), "d.py"}
    assert result.documents["id"].to_pylist() == sorted(result.documents["id"].to_pylist())
    assert result.documents.schema == table.schema


def test_exact_off_keeps_identical_documents():
    table = documents("code", {"a.py": "x = 1\n", "b.py": "x = 1\n"})
    result = deduplicate(table, DedupConfig(exact=False, near_threshold=None), SEED, LOG)
    assert (result.rows_out, result.exact_removed) == (2, 0)


def test_near_duplicates_are_removed_and_different_files_kept():
    base = long_file()
    lines = base.splitlines(keepends=True)
    edited = "".join(lines[:100] + ["total_100 = something_else(42)\n"] + lines[101:])
    assert edited != base and len(edited.splitlines()) == len(lines)
    table = documents("code", {"orig.py": base, "edit.py": edited, "other.py": other_file()})
    result = deduplicate(table, DedupConfig(near_threshold=0.8), SEED, LOG)
    assert (result.exact_removed, result.near_removed) == (0, 1)
    assert set(result.documents["path"].to_pylist()) == {first_by_id("code", "orig.py", "edit.py"), "other.py"}


def test_near_threshold_none_keeps_near_duplicates():
    base = long_file()
    table = documents("code", {"orig.py": base, "edit.py": base.replace("total_100", "total_hundred")})
    result = deduplicate(table, DedupConfig(near_threshold=None), SEED, LOG)
    assert result.rows_out == 2
    assert result.removed_share == 0.0


def test_dedup_is_deterministic_and_reports_removed_share():
    base = long_file()
    texts = {f"copy_{i}.py": base.replace(f"total_{i} ", f"renamed_{i} ") for i in range(6)}
    texts |= {"same.py": base, "same_again.py": base, "other.py": other_file()}
    table = documents("code", texts)
    config = DedupConfig(near_threshold=0.8)
    first = deduplicate(table, config, SEED, LOG)
    again = deduplicate(table.take(list(reversed(range(table.num_rows)))), config, SEED, LOG)
    assert first.documents.equals(again.documents)
    assert (first.rows_in, first.exact_removed, first.near_removed, first.rows_out) == (9, 1, 6, 2)
    assert first.removed_share == 7 / 9


def test_empty_input_removes_nothing():
    result = deduplicate(documents("code", {}), DedupConfig(), SEED, LOG)
    assert (result.rows_in, result.rows_out, result.removed_share) == (0, 0, 0.0)


def test_short_texts_are_one_shingle():
    assert shingles("a b", 5) == {b"a b"}
    assert shingles("a b c", 2) == {b"a b", b"b c"}
