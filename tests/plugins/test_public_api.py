"""`factory.plugin`, the one module plugin packages import: every name it exports resolves, and importing it stays light
(the registry imports every plugin, and `factory check` must not load torch or pyiceberg for them)."""

import subprocess
import sys

from tests.plugins.conftest import REPO


def test_every_exported_name_resolves_and_importing_the_module_loads_no_torch():
    code = ("import sys, factory.plugin as p; heavy = sorted(m for m in ('torch', 'pyiceberg', 'pyarrow') if m in sys.modules); "
            "[getattr(p, name) for name in p.__all__]; print(heavy, len(p.__all__))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    heavy, count = done.stdout.split("]")
    assert heavy == "[" and int(count) > 30, done.stdout
