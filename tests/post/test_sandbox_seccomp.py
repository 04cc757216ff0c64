"""The seccomp filter: no new namespace from inside the sandbox, even for code that has left Python's audit hook behind."""

import platform
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from factory.post.sandbox import Limits, Sandbox
from factory.post.sandbox_seccomp import INSTALL, namespace_filter

PROGRAM = namespace_filter(platform.machine())
NAMESPACE_CALLS = """
import ctypes, errno, os, threading
libc = ctypes.CDLL(None, use_errno=True)
def refused(result):
    return result == -1 and ctypes.get_errno() == errno.EPERM
SYS_CLONE = {"x86_64": 56, "aarch64": 220}[os.uname().machine]
print("unshare user", refused(libc.unshare(0x10000000)))
print("unshare net", refused(libc.unshare(0x40000000)))
print("setns", refused(libc.setns(0, 0)))
print("clone user", refused(libc.syscall(SYS_CLONE, 0x10000000 | 17, 0, 0, 0, 0)))
thread = threading.Thread(target=print, args=("thread runs",))
thread.start(); thread.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
print("fork exits", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
PROBE_C = r"""
#include <Python.h>
#include <errno.h>
#include <sched.h>
static struct PyModuleDef probe = {PyModuleDef_HEAD_INIT, "probe", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_probe(void) {
    PyObject *module = PyModule_Create(&probe);
    int result = unshare(0x10000000);  /* CLONE_NEWUSER */
    PyModule_AddIntConstant(module, "result", result);
    PyModule_AddIntConstant(module, "error", result ? errno : 0);
    return module;
}
"""
pytestmark = pytest.mark.skipif(PROGRAM is None, reason=f"no seccomp filter is built for {platform.machine()}")


def test_the_filter_refuses_new_namespaces_and_leaves_threads_and_processes(tmp_path):
    code = INSTALL + f"install, _ = filter_installer(bytes.fromhex({PROGRAM.hex()!r}))\ninstall()\n" + NAMESPACE_CALLS
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["unshare user True", "unshare net True", "setns True", "clone user True", "thread runs",
                                          "fork exits 7"]


def test_without_the_filter_the_same_calls_reach_the_kernel():
    """The check above can fail: unfiltered, the kernel answers (with a namespace where it allows one, or another refusal)."""
    result = subprocess.run([sys.executable, "-c", NAMESPACE_CALLS], capture_output=True, text=True, timeout=60, check=False)
    assert "setns False" in result.stdout, result.stdout + result.stderr  # fd 0 is no namespace: EINVAL, not the filter's EPERM


def test_a_machine_without_known_syscall_numbers_gets_no_filter():
    assert namespace_filter("sparc64") is None


@pytest.fixture(scope="module")
def probe_extension(tmp_path_factory) -> bytes:
    """A C extension whose import calls unshare(CLONE_NEWUSER): native code the audit hook never sees."""
    include = Path(sysconfig.get_paths()["include"])
    if shutil.which("gcc") is None or not (include / "Python.h").is_file():
        pytest.skip("building the probe needs gcc and the interpreter's headers")
    directory = tmp_path_factory.mktemp("probe")
    (directory / "probe.c").write_text(PROBE_C)
    built = directory / f"probe{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(["gcc", "-shared", "-fPIC", f"-I{include}", "-o", str(built), str(directory / "probe.c")], check=True, timeout=120)
    return built.read_bytes()


@pytest.mark.parametrize("mount_namespace", [True, False])
def test_native_code_in_the_sandbox_cannot_make_a_user_namespace(probe_extension, mount_namespace):
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    source = textwrap.dedent(f"""
        import sys
        open('probe{suffix}', 'wb').write(bytes.fromhex({probe_extension.hex()!r}))
        sys.path.insert(0, '.')
        import probe
        print(probe.result, probe.error)
    """)
    outcome = Sandbox(Limits(cpu_s=2, wall_s=10, file_mb=4), mount_namespace=mount_namespace).run(source)
    assert (outcome.status, outcome.stdout) == ("ok", "-1 1\n"), outcome  # EPERM
