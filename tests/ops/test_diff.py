"""`factory diff`: the recipe change, which stages the two share, and artifact provenance side by side."""

from factory.config import load, plan_stage
from factory.registry import ArtifactStore, Provenance
from factory.ops.diff import diff_artifacts, diff_experiments


def test_experiment_diff_names_the_change_and_the_shared_stages(tmp_path, tiny_path):
    base = load(tiny_path)
    other = base.model_copy(update={"name": "other", "pretrain": base.pretrain.model_copy(update={"lr": 0.001})})
    lines = diff_experiments(base, other, ArtifactStore(tmp_path))
    assert lines[0] == "config: pretrain.lr: 0.003 -> 0.001"
    assert any(line.startswith("tokenizer: same stage") for line in lines)
    assert any(line.startswith("pretrain: differs") for line in lines)


def test_artifact_diff_shows_config_inputs_and_code(tmp_path, tiny_path):
    registry = ArtifactStore(tmp_path)
    experiment = load(tiny_path)
    manifests = []
    for seed, corpus in ((1, "a" * 64), (2, "b" * 64)):
        spec = plan_stage(experiment.model_copy(update={"seed": seed}), "tokenizer", {"blend": corpus})
        with registry.staging() as out:
            (out / "t").write_text(str(seed))
            manifests.append(registry.publish(out, kind="tokenizer", fingerprint=spec.fingerprint, config=spec.config, inputs=spec.upstream,
                                              code=spec.code, provenance=Provenance(experiment="e", config_hash="h", git_commit="c"), summary={}))
    assert diff_artifacts(*manifests) == ["config: seed: 1 -> 2", f"input blend: {'a' * 12} -> {'b' * 12}"]
    assert diff_artifacts(manifests[0], manifests[0]) == ["identical provenance"]


BASE = """---
model: {n_layer: 2, n_head: 4, n_embd: 64, context: 64}
tokenizer: {vocab_size: 512}
pretrain: {steps: 2, batch_size: 2}
---
The base.
"""
FINE_TUNED = """---
sft:
  from: base.md#model
  steps: 3
  batch_size: 4
---
Starts from the base's model.
"""


def test_a_from_file_is_compared_with_its_bases_shape_tokenizer_and_blend_never_the_schema_defaults(tmp_path):
    (tmp_path / "base.md").write_text(BASE)
    (tmp_path / "ft.md").write_text(FINE_TUNED)
    base, tuned = load(tmp_path / "base.md"), load(tmp_path / "ft.md")
    registry = ArtifactStore(tmp_path / "registry")
    lines = diff_experiments(base, tuned, registry)
    assert [line for line in lines if line.startswith("config:")] == [
        "config: pretrain: only in base (steps=2, batch_size=2; the rest defaults)",
        "config: sft: only in ft (steps=3, batch_size=4, from='base.md#model'; the rest defaults)",
    ]  # no model.n_embd 64 -> 256, no tokenizer.vocab_size 512 -> 4096, no field of a missing section one by one
    everything = diff_experiments(base, tuned, registry, everything=True)
    assert "config: model.n_embd: 64 (both)" in everything and "config: tokenizer.vocab_size: 512 (both)" in everything
    assert "config: sft.steps: '(unset)' -> 3" in everything and "config: pretrain.lr: 0.001 -> '(unset)'" in everything
    (tmp_path / "ft2.md").write_text(FINE_TUNED.replace("steps: 3", "steps: 5"))
    assert diff_experiments(tuned, load(tmp_path / "ft2.md"), registry)[0] == "config: sft.steps: 3 -> 5"
