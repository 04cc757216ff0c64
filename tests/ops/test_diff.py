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
