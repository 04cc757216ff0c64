"""What the code can import in the sandbox: the whole standard library and the packages it was given, as its own user,
wherever the interpreter is installed; the modules the audit hook keeps out stay out."""

import os
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest

from factory.errors import ConfigError
from factory.post.sandbox import UID_BASE, UID_COUNT, Sandbox
from tests.post.sandboxes import MODES, ROOT, build

STDLIB = ("typing", "hashlib", "collections", "itertools", "math", "re", "heapq", "functools", "string", "json", "fractions",
          "bisect", "statistics", "decimal", "datetime", "dataclasses", "enum", "abc", "copy", "operator", "random", "textwrap",
          "unicodedata", "array", "struct", "zlib", "csv", "io", "inspect", "contextlib", "collections.abc",
          "zoneinfo", "importlib.resources", "base64", "html", "xml.etree.ElementTree", "sqlite3", "pickle", "pprint", "difflib")
"""Pure-Python modules, packages and C extensions from lib-dynload (hashlib, unicodedata, array, zlib, _sqlite3, _decimal)."""
BLOCKED = ("gc", "ctypes", "_ctypes", "socket", "_socket", "subprocess", "_posixsubprocess", "signal", "_signal", "resource",
           "mmap", "multiprocessing")
IMPORT_ALL = f"""import importlib, os
for name in {STDLIB!r}:
    importlib.import_module(name)
from collections import namedtuple
from typing import TypeVar
namedtuple("Point", "x y"), TypeVar("T"), "bücher".encode("idna")  # frames and encodings.* at run time, not only import
let_in = []
for name in {BLOCKED!r}:
    try:
        importlib.import_module(name)
        let_in.append(name)
    except ImportError as e:
        assert "not allowed" in str(e), e
print(os.getuid(), let_in)
"""


def reaches(path: str) -> str:
    """Code that prints whether the sandbox's user may enter `path`."""
    return f"import os\nprint(os.access({path!r}, os.R_OK | os.X_OK))\n"


@pytest.mark.parametrize("mode", MODES)
def test_the_whole_standard_library_imports_as_the_sandbox_user_and_the_hooks_list_stays_out(mode):
    sandbox = build(mode)
    outcome = sandbox.run(IMPORT_ALL)
    assert outcome.status == "ok", outcome.stderr
    uid, let_in = outcome.stdout.split(" ", 1)
    assert let_in == "[]\n" and (UID_BASE <= int(uid) < UID_BASE + UID_COUNT) == sandbox.root


@pytest.fixture(scope="module")
def hidden_python(tmp_path_factory) -> Path:
    """This interpreter copied (hard-linked where it can be) into a directory only root may enter, beside a world-readable
    file: a pyenv under /root (mode 0700), built on any machine. The binary still finds its libpython where it was."""
    if not ROOT:
        pytest.skip("the sandbox's own uid, which cannot enter the directory, needs root")
    hidden = tmp_path_factory.mktemp("hidden-python")
    hidden.chmod(0o700)
    (hidden / "beside.txt").write_text("the interpreter's neighbour\n")
    (hidden / "beside.txt").chmod(0o644)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    prefix = hidden / "prefix"
    shutil.copytree(stdlib, prefix / stdlib.relative_to(sys.base_prefix), copy_function=link,
                    ignore=shutil.ignore_patterns("site-packages", "test", "__pycache__"))
    (prefix / "bin").mkdir()
    link(os.path.realpath(sys.executable), prefix / "bin" / "python3")
    return prefix / "bin" / "python3"


def link(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem
        shutil.copy2(source, target)


@pytest.mark.parametrize("mode", ["unshare", "own uid"])
def test_without_a_mount_namespace_an_interpreter_the_user_cannot_reach_imports_and_shows_nothing_beside_it(mode, hidden_python):
    """Without a mount namespace the uid cannot enter the interpreter's directory: the imports go through what was opened
    before the drop, and that reaches nothing the directory hides (the world-readable file beside the copy)."""
    sandbox = build(mode, python=str(hidden_python))
    assert sandbox.run(reaches(str(hidden_python.parent.parent))).stdout == "False\n"  # the situation holds
    probe = IMPORT_ALL + ("import sys\nfound = []\nfor fd in os.listdir('/proc/self/fd'):\n    for up in range(1, 8):\n"
                          "        try:\n            found.append(open(f'/proc/self/fd/{fd}' + '/..' * up + '/beside.txt').read())\n"
                          "        except OSError:\n            pass\nprint(found, sys.prefix)\n")
    outcome = sandbox.run(probe)
    assert outcome.status == "ok", outcome.stderr
    imported, beside = outcome.stdout.splitlines()
    assert imported.endswith(" []") and beside == f"[] {hidden_python.parent.parent}"  # the copy ran, and saw nothing beside it


@pytest.mark.parametrize("mode", MODES)
def test_a_package_the_sandbox_is_given_imports_and_one_it_is_not_does_not(mode):
    pytest.importorskip("numpy")
    given = build(mode, packages=("numpy",)).run("import numpy\nprint(int(numpy.arange(5).sum()))")
    assert (given.status, given.stdout) == ("ok", "10\n"), given.stderr
    assert "No module named 'numpy'" in build(mode).run("import numpy").stderr


def test_a_package_that_is_not_installed_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"'no-such-sandbox-package' is not installed .*pip install no-such-sandbox-package"):
        Sandbox(packages=("no-such-sandbox-package",))
