"""The pull request's check: `make check` fails on an experiment file that does not load, naming it by file:line."""

import shutil
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def test_the_pull_request_check_fails_on_a_broken_file_and_names_its_line(tiny_path, tmp_path):
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "pull-request.yml").read_text())
    commands = [step.get("run") for job in workflow["jobs"].values() for step in job["steps"]]
    assert "make check" in commands

    experiments = tmp_path / "experiments"
    experiments.mkdir()
    shutil.copy(tiny_path, experiments / "good.md")
    (experiments / "broken.md").write_text("---\nextends: good.md\nmodel:\n  n_layer: two\n---\n")
    result = subprocess.run(["make", "-s", "check", f"EXPERIMENTS={experiments}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert f"{experiments / 'broken.md'}:4: model.n_layer:" in result.stderr, result.stderr
    assert f"ok  {experiments / 'good.md'}" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
