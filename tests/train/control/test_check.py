"""`factory check` on control sections: every problem names file:line and the dotted field, inherited ones too."""

import json
import textwrap
from pathlib import Path

from factory.config import load
from factory.preflight import check_files
from tests.forked import factory_command

REPO = Path(__file__).resolve().parents[3]
GOOD = """\
---
pretrain: {steps: 10}
control:
  eval_every: 5
  metrics:
    - {name: evals, kind: history, window: 10}
    - {name: batch, kind: batch_inspector}
  rules:
    - name: plateau
      on: [eval]
      when: "len(evals.eval_loss) >= 3 and max(evals.eval_loss[-3:]) - min(evals.eval_loss[-3:]) < 0.01"
      patience: {threshold: 2, mode: reset_on_false}
      do: [checkpoint, stop]
    - name: spike
      when: "batch.loss > 3 * batch.mean_loss"
      do: [log_batch, skip_batch]
---
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_the_issue_example_is_valid_and_on_stays_a_word(tmp_path):
    path = write(tmp_path, "good.md", GOOD)
    [report] = check_files([path])
    assert report.ok, report.errors
    assert load(path).control.rules[0].on == ("eval",)


def test_problems_name_file_line_and_field(tmp_path):
    bad = GOOD.replace('"batch.loss > 3 * batch.mean_loss"', '"batch.los > 3"').replace("[checkpoint, stop]", "[checkpoint, halt]")
    path = write(tmp_path, "bad.md", bad)
    [report] = check_files([path])
    assert report.errors == [
        f"{path}:13: control.rules.0.do.1: unknown operation 'halt'; registered: alert, checkpoint, evaluate, log, log_batch, rewind, "
        "scale_lr, skip_batch, stop",
        f"{path}:15: control.rules.1.when: batch.los is not a field of a BatchInspector metric; fields: loss, mean_loss, std_loss, count, "
        "max_sample_loss, sample_losses",
    ]


def test_a_problem_inherited_through_extends_names_the_parent_file(tmp_path):
    parent = write(tmp_path, "parent.md", GOOD.replace('"batch.loss > 3 * batch.mean_loss"', '"batch.loss > \'x\'"'))
    child = write(tmp_path, "child.md", "---\nextends: parent.md\npretrain: {steps: 20}\n---\n")
    [report] = check_files([child])
    assert len(report.errors) == 1 and report.errors[0].startswith(f"{parent}:15: control.rules.1.when: "), report.errors


def test_control_without_pretraining_and_unknown_keys(tmp_path):
    path = write(tmp_path, "nopre.md", "---\ncontrol:\n  rules: []\n  metric: []\n---\n")
    [report] = check_files([path])
    assert report.errors == [f"{path}:4: control.metric: unknown key; allowed here: budget_ms, eval_batches, eval_every, metrics, rules"]
    path.write_text("---\ncontrol:\n  rules: []\n---\n")
    [report] = check_files([path])
    assert report.errors == [f"{path}:2: control: rules run inside pretraining, but there is no pretrain section"]


def test_the_cli_exits_2_with_json_for_a_hostile_rule(tmp_path):
    path = write(tmp_path, "evil.md", GOOD.replace('"batch.loss > 3 * batch.mean_loss"', "\"().__class__.__bases__[0]\""))
    done = factory_command("check", "--json", str(path), "--root", str(tmp_path / "root"), cwd=REPO)
    assert done.returncode == 2, done.stderr
    [file] = json.loads(done.stdout)["files"]
    assert file["errors"][0].startswith(f"{path}:15: control.rules.1.when: ")


BRANCHES = "history.loss if step > 5 else step > 0"
"""Passed `factory check` before conditions were typed, then stopped training at step 6 with a window where true/false belongs."""
POWERS = "step ** 60 * step ** 60 * step ** 60 * step ** 60 > 1"
"""Passed `factory check` at step 1, then overflowed at step 20."""


def test_the_cli_refuses_a_non_boolean_branch_and_unbounded_powers_naming_file_line(tmp_path):
    good = GOOD.replace("{name: evals, kind: history, window: 10}", "{name: history, kind: history, window: 10}").replace(
        "max(evals.eval_loss[-3:]) - min(evals.eval_loss[-3:])", "max(history.eval_loss[-3:]) - min(history.eval_loss[-3:])").replace(
        "len(evals.eval_loss)", "len(history.eval_loss)").replace("steps: 10}", "steps: 100}")
    assert check_files([write(tmp_path, "fine.md", good)])[0].ok
    for name, when, says in [("branches.md", BRANCHES, "both branches of 'history.loss if step > 5 else step > 0' must be true/false"),
                             ("powers.md", POWERS, "can reach more than a float holds by step 100")]:
        path = write(tmp_path, name, good.replace('"batch.loss > 3 * batch.mean_loss"', f'"{when}"'))
        done = factory_command("check", "--json", str(path), "--root", str(tmp_path / "root"), cwd=REPO)
        assert done.returncode == 2, done.stderr
        [file] = json.loads(done.stdout)["files"]
        [error] = file["errors"]
        assert error.startswith(f"{path}:15: control.rules.1.when: ") and says in error, error
