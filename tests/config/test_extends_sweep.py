"""`extends` (deep merge, lists replaced, cycles refused) and `sweep` (named variants, limits, locations)."""

import pytest

from factory.config import load, load_file
from factory.errors import ConfigError


def write(path, front, body="why\n"):
    path.write_text(f"---\n{front}---\n{body}")
    return path


def test_extends_merges_sections_and_replaces_lists(tmp_path, tiny_path):
    base = tmp_path / "base.md"
    base.write_text(tiny_path.read_text())
    child = write(tmp_path / "child.md", "extends: base.md\npretrain:\n  lr: 0.001\neval:\n  benchmarks: [val_bpb]\n")
    parent, experiment = load(base), load(child)
    assert experiment.name == "child" and experiment.description == "why"
    assert experiment.pretrain.lr == 0.001 and experiment.pretrain.steps == parent.pretrain.steps
    assert experiment.model == parent.model and experiment.eval.benchmarks == ("val_bpb",)


def test_extends_cycle_and_missing_parent_are_config_errors(tmp_path):
    write(tmp_path / "a.md", "extends: b.md\n")
    write(tmp_path / "b.md", "extends: a.md\n")
    with pytest.raises(ConfigError, match=r"b.md:2: extends: cycle .*a.md -> .*b.md -> .*a.md"):
        load(tmp_path / "a.md")
    write(tmp_path / "c.md", "seed: 1\nextends: nope.md\n")
    with pytest.raises(ConfigError, match=r"c.md:3: extends: .*nope.md"):
        load(tmp_path / "c.md")


def test_errors_in_an_inherited_key_point_at_the_parent_file(tmp_path):
    write(tmp_path / "base.md", "pretrain:\n  steps: 10\n  warmup_steps: 5\n")
    write(tmp_path / "child.md", "extends: base.md\npretrain:\n  steps: 3\n")
    with pytest.raises(ConfigError, match=r"child.md:3: pretrain: warmup_steps"):
        load(tmp_path / "child.md")


def test_sweep_expands_a_grid_into_named_variants(tmp_path, tiny_path):
    (tmp_path / "base.md").write_text(tiny_path.read_text())
    sweep = write(tmp_path / "grid.md", "extends: base.md\nsweep:\n  pretrain.lr: [0.001, 0.002]\n  model.n_layer: [1, 2, 3]\n")
    variants = load_file(sweep)
    assert len(variants) == 6 and len({v.name for v in variants}) == 6
    assert variants[0].name == "grid.lr=0.001.n_layer=1" and variants[0].variant == {"pretrain.lr": 0.001, "model.n_layer": 1}
    assert [v.model.n_layer for v in variants] == [1, 2, 3, 1, 2, 3]
    with pytest.raises(ConfigError, match="sweep of 6 variants"):
        load(sweep)
    with pytest.raises(ConfigError, match=r"grid.md:3: sweep: expands to 6 variants, more than the limit of 4"):
        load_file(sweep, max_variants=4)


def test_a_bad_swept_value_names_the_sweep_line(tmp_path, tiny_path):
    (tmp_path / "base.md").write_text(tiny_path.read_text())
    sweep = write(tmp_path / "grid.md", "extends: base.md\nsweep:\n  pretrain.lr: [0.001, -1]\n")
    with pytest.raises(ConfigError, match=r"grid.md:4: pretrain.lr: .*found -1"):
        load_file(sweep)
    write(tmp_path / "typo.md", "extends: base.md\nsweep:\n  pretrain.lrr: [1]\n")
    with pytest.raises(ConfigError, match=r"typo.md:4: pretrain.lrr: unknown key"):
        load_file(tmp_path / "typo.md")


@pytest.mark.parametrize(("values", "line", "shown"), [
    ("[0.001, 1e-3]", 5, "(0.001 and 0.001)"),
    ("[300, 300.0]", 5, "(300 and 300.0)"),
    ("\n    - 0.002\n    - 0.001\n    - 1.0E-3", 8, "values 2 and 3 (0.001 and 0.001)"),
])
def test_values_of_one_axis_that_the_field_reads_alike_are_refused_at_the_later_one(tmp_path, values, line, shown):
    field = "steps" if "300" in values else "lr"
    grid = write(tmp_path / "grid.md", f"pretrain: {{steps: 10}}\nsweep:\n  model.n_layer: [1, 2]\n  pretrain.{field}: {values}\n")
    with pytest.raises(ConfigError) as caught:
        load_file(grid)
    message = str(caught.value)
    assert message.startswith(f"{grid}:{line}: sweep.pretrain.{field}: ") and shown in message, message
    assert "would be one recipe twice" in message


def test_yaml_exponents_are_numbers_where_a_float_or_a_whole_number_is_expected(tmp_path):
    experiment = load(write(tmp_path / "exp.md", "pretrain: {steps: 1e3, lr: 3e-4}\n"))
    assert (experiment.pretrain.steps, experiment.pretrain.lr) == (1000, 0.0003)
    grid = load_file(write(tmp_path / "grid.md", "pretrain: {steps: 10}\nsweep:\n  pretrain.lr: [1e-3, 2e-3]\n"))
    assert [v.name for v in grid] == ["grid.lr=0.001", "grid.lr=0.002"]
