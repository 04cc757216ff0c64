"""Hostile experiment files (they come from pull requests and run unattended): refused with file:line, in bounded
time and memory, without opening devices, FIFOs or files outside the trees the factory reads.

Whatever could hang or exhaust memory on a regression runs in a child process with a timeout, so the regression
fails the test instead of stalling the suite.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from factory.config import load, load_file
from factory.config.files import DATA_ROOTS_ENV, MAX_FILE_BYTES
from factory.config.front_matter import MAX_INT, MAX_YAML_DEPTH
from factory.config.loader import MAX_EXTENDS_DEPTH
from factory.config.data_sections import SourceConfig
from factory.config.sources import matching_files, source_files, source_root
from factory.data.ingest import read_documents
from factory.errors import ConfigError
from factory.preflight import check_files
from tests.forked import factory_command

REPO = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT_S = 120
GOOD = "---\npretrain: {steps: 10}\n---\nwhy\n"
LAUGHS = "---\na: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
) + "---\n"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_file(path)
    return str(caught.value)


def in_child(code: str) -> str:
    """Run `code` in a fresh interpreter (bounded by a timeout); its stdout."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=CHILD_TIMEOUT_S, cwd=REPO, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def child_error(path: Path) -> str:
    """The ConfigError of loading `path`, and how much the peak memory grew, in a child process."""
    return in_child(f"""
        import resource
        from factory.config import load_file
        from factory.errors import ConfigError
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            load_file({str(path)!r})
            print("LOADED")
        except ConfigError as e:
            print(e)
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(f"GROWN_KIB={{grown_kib}}")
    """)


def test_billion_laughs_is_refused_with_a_line_and_bounded_memory(tmp_path):
    path = write(tmp_path / "laughs.md", LAUGHS)
    assert len(LAUGHS) < 400
    out = child_error(path)
    assert f"{path}:" in out and "expands to more than" in out, out
    grown_kib = int(out.rsplit("GROWN_KIB=", 1)[1])
    assert grown_kib < 200 * 1024, f"peak memory grew by {grown_kib} KiB"


def test_factory_check_refuses_billion_laughs_with_exit_2(tmp_path):
    path = write(tmp_path / "laughs.md", LAUGHS)
    result = subprocess.run([sys.executable, "-c", "from factory.cli import main; main()", "check", str(path)],
                            capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, cwd=REPO, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "expands to more than" in result.stdout + result.stderr


def test_deep_nesting_is_refused(tmp_path):
    depth = 100_000
    path = write(tmp_path / "deep.md", "---\ndata: " + "[" * depth + "]" * depth + "\n---\n")
    out = child_error(path)
    assert f"{path}:" in out and f"deeper than {MAX_YAML_DEPTH} levels" in out, out


def test_extends_of_dev_zero_is_refused_without_reading_it(tmp_path):
    path = write(tmp_path / "zero.md", "---\nextends: /dev/zero\n---\n")
    out = child_error(path)
    assert f"{path}:2: extends:" in out and "/dev" in out, out


def test_extends_of_a_symlink_to_a_device_is_refused(tmp_path):
    (tmp_path / "parent.md").symlink_to("/dev/zero")
    path = write(tmp_path / "child.md", "---\nextends: parent.md\n---\n")
    out = child_error(path)
    assert f"{path}:2: extends:" in out and "LOADED" not in out, out


def test_extends_of_a_fifo_is_refused_without_hanging(tmp_path):
    os.mkfifo(tmp_path / "parent.md")
    path = write(tmp_path / "child.md", "---\nextends: parent.md\n---\n")
    out = child_error(path)
    assert f"{path}:2: extends:" in out and "FIFO" in out, out


def test_extends_outside_the_repository_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ROOTS_ENV)
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    write(tmp_path / "outside.md", GOOD)
    path = write(tmp_path / "repo" / "child.md", "---\nextends: ../outside.md\n---\n")
    assert f"{path}:2: extends:" in error_of(path) and "outside" in error_of(path)


def test_a_long_extends_chain_is_refused(tmp_path):
    write(tmp_path / "f0.md", GOOD)
    for i in range(1, MAX_EXTENDS_DEPTH + 3):
        write(tmp_path / f"f{i}.md", f"---\nextends: f{i - 1}.md\n---\n")
    assert f"more than {MAX_EXTENDS_DEPTH} files" in error_of(tmp_path / f"f{MAX_EXTENDS_DEPTH + 2}.md")
    assert load(tmp_path / f"f{MAX_EXTENDS_DEPTH}.md").pretrain.steps == 10


def test_a_fifo_named_as_the_experiment_is_refused_without_hanging(tmp_path):
    os.mkfifo(tmp_path / "fifo.md")
    out = child_error(tmp_path / "fifo.md")
    assert "is a FIFO, not a regular file" in out, out


def directory_experiment(tmp_path: Path, source: Path) -> Path:
    return write(tmp_path / "exp.md", f"---\ndata:\n  datasets:\n    a: {{source: {{kind: directory, path: {source}}}}}\n"
                                      "  blend: [{dataset: a}]\npretrain: {steps: 10}\n---\n")


def test_a_directory_source_in_proc_is_refused_by_check(tmp_path):
    path = directory_experiment(tmp_path, Path("/proc"))
    [report] = check_files([path])
    assert any(error.startswith(f"{path}:4: data.datasets.a.source.path:") and "/proc" in error for error in report.errors), report.errors


def test_a_directory_source_outside_the_data_roots_is_refused(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    monkeypatch.setenv(DATA_ROOTS_ENV, str(tmp_path / "data"))
    path = directory_experiment(tmp_path, Path("/etc"))
    [report] = check_files([path])
    assert any(f"{path}:4: data.datasets.a.source.path:" in e and "outside the directories" in e for e in report.errors), report.errors
    with pytest.raises(ConfigError, match="outside the directories"):
        source_root(SourceConfig(kind="directory", path="/etc"))


def test_the_listing_leaves_out_links_out_of_the_roots_and_never_opens_a_fifo(tmp_path, monkeypatch):
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setenv(DATA_ROOTS_ENV, str(root))
    write(root / "good.txt", "hello")
    os.mkfifo(root / "fifo.txt")
    (root / "kmsg.txt").symlink_to("/proc/kmsg")
    (root / "zero.txt").symlink_to("/dev/zero")
    write(tmp_path / "secret.txt", "not data")
    (root / "secret.txt").symlink_to(tmp_path / "secret.txt")
    (root / "inside.txt").symlink_to(root / "good.txt")
    config = SourceConfig(kind="directory", path=str(root), include=("*.txt",))
    assert matching_files(source_root(config), config) == ["fifo.txt", "good.txt", "inside.txt"]
    monkeypatch.setenv("FACTORY_CACHE", str(tmp_path / "cache"))
    listing = source_files(config).files
    assert listing["fifo.txt"] == "unreadable" and listing["good.txt"] == listing["inside.txt"] != "unreadable"
    with read_documents("d", config, logging.getLogger("test.hostile")) as ingested:
        paths = [path for batch in ingested.documents.batches() for path in batch["path"].to_pylist()]
    assert sorted(paths) == ["good.txt", "inside.txt"] and ingested.skipped["unreadable"] == 1


def test_a_hanging_or_broken_sibling_does_not_block_a_good_file(tmp_path):
    write(tmp_path / "good.md", GOOD)
    os.mkfifo(tmp_path / "fifo.md")
    write(tmp_path / "zero.md", "---\nextends: /dev/zero\n---\n")
    write(tmp_path / "laughs.md", LAUGHS)
    out = in_child(f"""
        from resources.experiments import ExperimentFiles
        print(ExperimentFiles(directory={str(tmp_path)!r}).load("good").name)
    """)
    assert out.strip().splitlines()[-1] == "good"


@pytest.mark.parametrize("line", ["pretrain: {steps: 10, lr: .inf}", "pretrain: {steps: 10, betas: [0.9, .nan]}",
                                  "pretrain: {steps: 10}\ndata: {blend: [{table: a.b@v1, weight: .inf}]}",
                                  "pretrain: {steps: 10}\ncontrol: {rules: [{name: r, when: 'x > 1', do: [{scale_lr: .nan}]}]}"])
def test_non_finite_numbers_are_refused_with_their_line(tmp_path, line):
    path = write(tmp_path / "inf.md", f"---\n{line}\n---\n")
    message = error_of(path)
    assert f"{path}:{line.count(chr(10)) + 2}:" in message and "not a finite number" in message, message


NESTED = "{a: " * (MAX_YAML_DEPTH + 5) + "1" + "}" * (MAX_YAML_DEPTH + 5)


@pytest.mark.parametrize(("front", "expected"), [
    (f"pretrain: {{steps: 10}}\nx: {NESTED}", f"{{path}}:3: the front matter nests deeper than {MAX_YAML_DEPTH} levels"),
    ("x: &a [*a]\npretrain: {steps: 10}", f"{{path}}:2: the front matter nests deeper than {MAX_YAML_DEPTH} levels"),
    ("pretrain: {steps: 10}\nseed: " + "9" * 100_000, f"{{path}}:3: '99999999999999999999...' is not an integer within ±{MAX_INT}"),
    ("pretrain: {steps: 99999999999999999}", "{path}:2: pretrain.steps: Input should be less than or equal to"),
    ("pretrain: {steps: 10}\n#" + "x" * MAX_FILE_BYTES, f"{{path}}: {MAX_FILE_BYTES + 36} bytes, more than the limit of {MAX_FILE_BYTES}"),
    ("pretrain: {steps: 10}\nsweep:\n  pretrain.lr: [0.001, .inf]", "{path}:4: pretrain.lr: inf is not a finite number"),
    ("pretrain: {steps: 10}\nsweep:\n  pretrain.lr: [0.001, 1.0e-3]", "{path}:4: sweep.pretrain.lr: values 1 and 2 (0.001 and 0.001) are one value"),
])
def test_values_out_of_bounds_are_refused_with_their_line(tmp_path, front, expected):
    path = write(tmp_path / "bad.md", f"---\n{front}\n---\nwhy\n")
    assert expected.format(path=path) in error_of(path)


HUGE_INTEGERS = ["0x" + "f" * 5000, "0b" + "1" * 64, "0x8000000000000000", "0" + "7" * 22, "9_223_372_036_854_775_808",
                 "-9223372036854775808", "1" + ":59" * 11, "1" + ":0" * 5000, "!!int abc", "!!int 0o17"]


@pytest.mark.parametrize("value", HUGE_INTEGERS)
def test_integers_are_bounded_by_value_whatever_their_base(tmp_path, value):
    path = write(tmp_path / "int.md", f"---\npretrain: {{steps: 10}}\nseed: {value}\n---\n")
    assert f"{path}:3: " in (message := error_of(path)) and f"is not an integer within ±{MAX_INT} (64 bits)" in message, message


@pytest.mark.parametrize(("value", "expected"), [("0x7fffffffffffffff", MAX_INT), ("0b101", 5), ("017", 15), ("1_000", 1000),
                                                 ("1:30", 90), ("0x1_0", 16), ("0" * 5000 + "1", 1)])
def test_integers_in_range_read_as_yaml_writes_them_in_any_base(tmp_path, value, expected):
    assert load(write(tmp_path / "int.md", f"---\npretrain: {{steps: 10}}\nseed: {value}\n---\n")).seed == expected


def test_check_of_a_directory_with_a_huge_hex_seed_refuses_that_file_and_checks_the_others(tmp_path):
    write(tmp_path / "good.md", GOOD)
    bad = write(tmp_path / "hex.md", "---\npretrain: {steps: 10}\nseed: 0x" + "f" * 5000 + "\n---\n")
    result = factory_command("check", str(tmp_path), timeout_s=CHILD_TIMEOUT_S, cwd=REPO)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output, output
    assert f"{bad}:3: " in output and "good" in output, output


def test_a_good_file_still_loads(tmp_path):
    assert load(write(tmp_path / "good.md", GOOD)).pretrain.steps == 10


def test_files_at_a_commit_leave_out_oversized_blobs(tmp_path):
    from factory.registry.provenance import files_at_commit

    write(tmp_path / "good.md", GOOD)
    write(tmp_path / "huge.md", GOOD + "x" * (MAX_FILE_BYTES + 1))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "files"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    assert sorted(p.name for p in files_at_commit(tmp_path, "HEAD", max_bytes=MAX_FILE_BYTES)) == ["good.md"]
    assert sorted(p.name for p in files_at_commit(tmp_path, "HEAD")) == ["good.md", "huge.md"]


def home_with_a_key(tmp_path: Path) -> tuple[Path, Path]:
    """A home directory holding a private key, and a repository beside it (outside it): (home, repository)."""
    home, repo = tmp_path / "home", tmp_path / "repo"
    (home / ".ssh").mkdir(parents=True)
    write(home / ".ssh" / "id_ed25519", "-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (repo / ".git").mkdir(parents=True)
    return home, repo


def check_in(repo: Path, home: Path, path: Path) -> subprocess.CompletedProcess:
    """`factory check PATH` from the repository, with no data roots set but what its settings say."""
    env = {key: value for key, value in os.environ.items() if key != DATA_ROOTS_ENV} | {"HOME": str(home)}
    return factory_command("check", str(path), cwd=repo, env=env, timeout_s=CHILD_TIMEOUT_S)


def test_a_directory_source_in_home_is_refused_unless_a_setting_names_that_root(tmp_path):
    home, repo = home_with_a_key(tmp_path)
    path = write(repo / "keys.md", f"---\ndata:\n  datasets:\n    a:\n      source: {{kind: directory, path: {home}, include: ['.ssh/*']}}\n"
                                   "  blend: [{dataset: a}]\npretrain: {steps: 10}\n---\n")
    refused = check_in(repo, home, path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"{path}:5: data.datasets.a.source.path: {home.resolve()} is outside the directories the factory reads " \
           f"({repo.resolve()};" in refused.stderr and "Traceback" not in refused.stderr
    write(repo / "factory.toml", 'data_roots = ["../home"]\n')
    assert check_in(repo, home, path).returncode == 0


def test_a_committed_symlink_into_home_is_refused(tmp_path, monkeypatch):
    home, repo = home_with_a_key(tmp_path)
    (repo / "data").mkdir()
    (repo / "data" / "notes.txt").write_text("notes\n")
    (repo / "data" / "key.txt").symlink_to(home / ".ssh" / "id_ed25519")
    (repo / "keys").symlink_to(home / ".ssh")
    path = write(repo / "keys.md", "---\ndata:\n  datasets:\n    a:\n      source: {kind: directory, path: keys, include: ['*']}\n"
                                   "  blend: [{dataset: a}]\npretrain: {steps: 10}\n---\n")
    refused = check_in(repo, home, path)
    assert refused.returncode == 2 and f"{path}:5: data.datasets.a.source.path: {(home / '.ssh').resolve()} is outside" in refused.stderr
    monkeypatch.delenv(DATA_ROOTS_ENV)
    monkeypatch.chdir(repo)  # the default data roots: this repository only
    config = SourceConfig(kind="directory", path="data", include=("*",))
    assert matching_files(source_root(config), config) == ["notes.txt"]  # the link out of the roots is never listed
