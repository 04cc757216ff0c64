"""Loading Markdown experiment files: the shared tiny experiment, and errors that name file:line and field."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from factory.config import Experiment, load
from factory.errors import ConfigError

EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "tiny-code-lm.md"
TEXT = EXPERIMENT.read_text(encoding="utf-8")
PINNED = "registry.example/factory@sha256:" + "ab" * 32


def line_of(text: str, line: str) -> int:
    """1-based number of the first line of `text` equal to `line` (must occur exactly once)."""
    lines = text.splitlines()
    assert lines.count(line) == 1, f"{line!r} occurs {lines.count(line)} times"
    return lines.index(line) + 1


def write_variant(tmp_path: Path, old: str, new: str, name: str = "variant.md") -> tuple[Path, str]:
    """Copy the tiny experiment into tmp_path with one exact line replaced."""
    assert TEXT.splitlines().count(old) == 1, f"{old!r} is not one line of {EXPERIMENT.name}"
    text = TEXT.replace(old + "\n", new + "\n", 1)
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path, text


def load_error(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load(path)
    return str(caught.value)


def test_loads_the_shared_experiment_into_a_frozen_spec():
    experiment = load(EXPERIMENT)
    assert isinstance(experiment, Experiment)
    assert experiment.name == "tiny-code-lm"
    assert experiment.seed == 1234
    assert experiment.model.n_layer == 2 and experiment.model.n_embd == 128
    assert experiment.pretrain.steps == 300 and experiment.pretrain.lr == 0.003
    assert experiment.pretrain.betas == (0.9, 0.95)  # default, not in the file
    assert experiment.tokenizer.vocab_size == 2048
    assert experiment.description.startswith("# tiny-code-lm: the smallest model")
    assert experiment.description == TEXT.split("\n---\n", 1)[1].strip()
    assert "---" not in experiment.description.splitlines()


def test_the_spec_cannot_be_mutated():
    experiment = load(EXPERIMENT)
    with pytest.raises(pydantic.ValidationError):
        experiment.seed = 1
    with pytest.raises(pydantic.ValidationError):
        experiment.pretrain.steps = 1
    assert experiment.seed == 1234 and experiment.pretrain.steps == 300


def test_name_and_description_in_front_matter_win_over_stem_and_body(tmp_path):
    path, _ = write_variant(tmp_path, "seed: 1234", "seed: 1234\nname: other-name\ndescription: short")
    experiment = load(path)
    assert experiment.name == "other-name"
    assert experiment.description == "short"


def test_name_defaults_to_the_file_stem(tmp_path):
    path = tmp_path / "my-run.v2.md"
    path.write_text(TEXT, encoding="utf-8")
    assert load(path).name == "my-run.v2"


def test_wrong_type_names_file_line_and_field(tmp_path):
    path, text = write_variant(tmp_path, "  steps: 300", "  steps: many")
    message = load_error(path)
    assert f"{path}:{line_of(text, '  steps: many')}: pretrain.steps:" in message
    assert "'many'" in message


def test_wrong_type_deep_in_a_section_points_at_its_own_line(tmp_path):
    path, text = write_variant(tmp_path, "  batch_size: 32", "  batch_size: lots")
    message = load_error(path)
    assert f"{path}:{line_of(text, '  batch_size: lots')}: eval.batch_size:" in message
    assert "pretrain.batch_size" not in message


def test_unknown_top_level_key_lists_the_allowed_keys(tmp_path):
    path, text = write_variant(tmp_path, "pretrain:", "pretrian:")
    message = load_error(path)
    line = line_of(text, "pretrian:")
    assert f"{path}:{line}: pretrian: unknown key; allowed here:" in message
    for key in ("data", "eval", "image", "model", "pretrain", "resources", "seed", "tokenizer"):
        assert key in message.split("allowed here:", 1)[1]


def test_unknown_nested_key_lists_the_allowed_keys_of_its_section(tmp_path):
    path, text = write_variant(tmp_path, "  n_layer: 2", "  n_layers: 2")
    message = load_error(path)
    assert f"{path}:{line_of(text, '  n_layers: 2')}: model.n_layers: unknown key" in message
    allowed = message.split("allowed here:", 1)[1]
    assert "arch, context, dropout, from_hf, intermediate_size, n_embd, n_head, n_kv_head, n_layer, norm_eps, positions, rope_theta, tie_embeddings" in allowed
    assert "pretrain" not in allowed


def test_missing_required_field_points_at_its_section(tmp_path):
    path, text = write_variant(tmp_path, "  steps: 300", "")
    message = load_error(path)
    assert f"{path}:{line_of(text, 'pretrain:')}: pretrain.steps: required field is missing" in message


def test_duplicate_key_is_rejected_at_its_second_line(tmp_path):
    path, text = write_variant(tmp_path, "  lr: 0.003", "  lr: 0.003\n  lr: 0.01")
    message = load_error(path)
    assert f"{path}:{line_of(text, '  lr: 0.01')}: pretrain.lr: key given twice" in message


def test_duplicate_section_is_rejected(tmp_path):
    path, text = write_variant(tmp_path, "seed: 1234", "seed: 1234\nseed: 99")
    message = load_error(path)
    assert f"{path}:{line_of(text, 'seed: 99')}: seed: key given twice" in message


def test_invalid_yaml_names_the_line_of_the_error(tmp_path):
    path, text = write_variant(tmp_path, "  lr: 0.003", "  lr: 0.003: x")
    message = load_error(path)
    assert message.startswith(f"{path}:{line_of(text, '  lr: 0.003: x')}: invalid YAML:")


def test_front_matter_that_is_not_a_mapping_is_rejected(tmp_path):
    path = tmp_path / "list.md"
    path.write_text("---\n- a\n- b\n---\nbody\n", encoding="utf-8")
    message = load_error(path)
    assert f"{path}:2:" in message and "mapping" in message


def test_file_without_front_matter_is_rejected(tmp_path):
    path = tmp_path / "plain.md"
    path.write_text("# just prose\n\nno front matter here\n", encoding="utf-8")
    message = load_error(path)
    assert message.startswith(f"{path}:1:") and "'---'" in message


def test_unclosed_front_matter_is_rejected(tmp_path):
    path = tmp_path / "unclosed.md"
    path.write_text(TEXT.replace("\n---\n", "\n", 1), encoding="utf-8")
    message = load_error(path)
    assert message.startswith(f"{path}:1:") and "never closed" in message


def test_width_must_divide_by_heads(tmp_path):
    path, text = write_variant(tmp_path, "  n_embd: 128", "  n_embd: 130")
    message = load_error(path)
    assert f"{path}:{line_of(text, 'model:')}: model:" in message
    assert "n_embd (130) must be divisible by n_head (4)" in message


def test_warmup_must_be_below_steps(tmp_path):
    path, text = write_variant(tmp_path, "  warmup_steps: 30", "  warmup_steps: 300")
    message = load_error(path)
    assert f"{path}:{line_of(text, 'pretrain:')}: pretrain:" in message
    assert "warmup_steps (300) must be below steps (300)" in message


def test_the_primary_benchmark_must_be_one_the_file_evaluates(tmp_path):
    line = "  benchmarks: [heldout_bpb, val_bpb, next_line]"
    path, text = write_variant(tmp_path, line, line + "\n  primary: code_exec")
    message = load_error(path)
    assert f"{path}:{line_of(text, '  primary: code_exec')}: eval.primary:" in message
    assert "'code_exec' is not one of eval.benchmarks (heldout_bpb, val_bpb, next_line)" in message
    chosen, _ = write_variant(tmp_path, line, line + "\n  primary: next_line", "chosen.md")
    assert load(chosen).eval.primary == "next_line"


def test_unpinned_image_is_rejected(tmp_path):
    path, text = write_variant(tmp_path, "image: local", "image: foo:latest")
    message = load_error(path)
    assert f"{path}:{line_of(text, 'image: foo:latest')}: image:" in message
    assert "'foo:latest'" in message


def test_image_pinned_by_digest_is_accepted(tmp_path):
    path, _ = write_variant(tmp_path, "image: local", f"image: {PINNED}")
    assert load(path).image == PINNED


def test_image_with_a_short_digest_is_rejected(tmp_path):
    path, _ = write_variant(tmp_path, "image: local", "image: foo@sha256:abc123")
    assert "image:" in load_error(path)


def test_invalid_name_in_front_matter_is_rejected(tmp_path):
    path, text = write_variant(tmp_path, "seed: 1234", "seed: 1234\nname: Tiny Code")
    message = load_error(path)
    assert f"{path}:{line_of(text, 'name: Tiny Code')}: name:" in message
    assert "not a valid experiment name" in message


def test_invalid_file_stem_is_rejected_as_a_name(tmp_path):
    path = tmp_path / "Tiny Code.md"
    path.write_text(TEXT, encoding="utf-8")
    message = load_error(path)
    assert str(path) in message and "'Tiny Code' is not a valid experiment name" in message


def test_missing_file_is_a_config_error(tmp_path):
    path = tmp_path / "nowhere.md"
    message = load_error(path)
    assert str(path) in message and "no such experiment file" in message


def test_an_unknown_key_inside_a_named_section_lists_that_sections_fields(tmp_path):
    path = tmp_path / "exp.md"
    path.write_text("---\ndata:\n  datasets:\n    stdlib: {colour: red}\n---\n")
    with pytest.raises(ConfigError) as failed:
        load(path)
    assert str(failed.value) == f"{path}:4: data.datasets.stdlib.colour: unknown key; allowed here: dedup, filters, max_duplicate_share, source, tag"


@pytest.mark.parametrize("tag", ["content-abc", "rejected-abc"])
def test_a_dataset_tag_may_not_look_like_a_content_or_rejection_tag(tmp_path, tag):
    path = tmp_path / "exp.md"
    path.write_text(f"---\ndata:\n  datasets:\n    stdlib: {{tag: {tag}}}\n---\n")
    assert "not starting with 'content-' or 'rejected-'" in load_error(path)
