"""`from:`: a post-training stage starts from a model made elsewhere (another file's, an alias's, a digest's), resolved
to one digest when the file is planned; every way it cannot be resolved is a ConfigError naming file:line."""

import json
from pathlib import Path

import pytest

from factory.config import load, load_file, plan_stage
from factory.config.schema import ModelConfig
from factory.config.stages import BASE, stage_config, stages_of
from factory.errors import ConfigError
from factory.ops.bases import bind, resolve
from factory.ops.lineage import Lineage
from factory.ops.plan import build_plan
from factory.ops.promote import promote
from factory.preflight import check_files
from factory.registry.layout import MODEL_CONFIG
from factory.registry.store import ArtifactStore, Provenance

SHAPE = {"n_layer": 1, "n_head": 2, "n_embd": 32, "context": 64}
BASE_FILE = f"""---
model: {json.dumps(SHAPE)}
pretrain: {{steps: 2, batch_size: 2}}
---
The base.
"""
SFT = """---
sft:
  from: {ref}
  steps: 3
  batch_size: 4
---
Fine-tuned from {ref}.
"""


def publish(registry: ArtifactStore, kind: str, inputs: dict[str, str], experiment: str, files: dict[str, str], fingerprint: str,
            base: dict | None = None) -> str:
    """Publish an artifact of `files` as a stage of `kind` would: its digest."""
    with registry.staging() as out:
        for name, text in files.items():
            (out / name).write_text(text)
        manifest = registry.publish(out, kind=kind, fingerprint=fingerprint, config={}, inputs=inputs, code="local:test",
                                    provenance=Provenance(experiment=experiment, config_hash="0" * 16, git_commit="c0ffee",
                                                          base=base or {}),
                                    summary={})
    return manifest.digest


def made_model(registry: ArtifactStore, experiment: str, seed: str, shape: dict | None = None) -> dict[str, str]:
    """A blend, a tokenizer, a pretraining and the model exported from it, in the registry: their digests."""
    blend = publish(registry, "blend", {}, experiment, {"blend.json": seed}, f"blend-{seed}")
    tokenizer = publish(registry, "tokenizer", {"blend": blend}, experiment, {"tokenizer.json": seed}, f"tok-{seed}")
    pretrain = publish(registry, "pretrain", {"blend": blend, "tokenizer": tokenizer}, experiment, {"run.json": seed}, f"pre-{seed}")
    record = {"model": ModelConfig(**(shape or SHAPE)).model_dump(mode="json")}
    model = publish(registry, "model", {"pretrain": pretrain, "tokenizer": tokenizer}, experiment,
                    {MODEL_CONFIG: json.dumps(record), "model.pt": seed}, f"model-{seed}")
    return {"blend": blend, "tokenizer": tokenizer, "pretrain": pretrain, "model": model}


def based(tmp_path: Path, ref: str, name: str = "ft.md", extra: str = "") -> Path:
    path = tmp_path / name
    path.write_text(SFT.format(ref=ref).replace("---\nFine", f"{extra}---\nFine") if extra else SFT.format(ref=ref))
    return path


@pytest.fixture
def registry(tmp_path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "registry")


def test_an_alias_resolves_to_the_model_it_names_with_the_blend_and_tokenizer_of_its_lineage(tmp_path, registry):
    made = made_model(registry, "base", "a")
    model = next(registry.manifests("model"))
    promote(registry, model, "production", "first", "test", "none")
    experiment = load(based(tmp_path, "alias:production"))
    base = resolve(experiment, registry)
    assert base.digest == made["model"]
    assert base.inputs == {BASE: made["model"], "blend": made["blend"], "tokenizer": made["tokenizer"]}
    assert base.said.startswith(f"production = model {made['model'][:12]} (promoted ") and base.experiment == "base"
    bound = bind(experiment, registry)
    assert bound.model == ModelConfig(**SHAPE) and stages_of(bound) == ("sft", "model")  # no data, tokenizer or pretraining of its own
    spec = plan_stage(bound, "sft", {})
    assert spec.upstream == {BASE: made["model"], "blend": made["blend"], "tokenizer": made["tokenizer"]}
    assert "from" not in json.dumps(spec.config)  # the digest is the input; how the file named it is not


def test_the_same_model_named_by_alias_or_by_digest_is_one_stage(tmp_path, registry):
    made = made_model(registry, "base", "a")
    promote(registry, next(registry.manifests("model")), "production", "first", "test", "none")
    by_alias = bind(load(based(tmp_path, "alias:production", "a.md")), registry)
    by_digest = bind(load(based(tmp_path, f"model@{made['model'][:16]}", "b.md")), registry)
    assert plan_stage(by_alias, "sft", {}).fingerprint == plan_stage(by_digest, "sft", {}).fingerprint


def test_refs_that_resolve_to_nothing_say_where_what_and_what_exists(tmp_path, registry):
    made = made_model(registry, "base", "a")
    cases = {
        "alias:staging": "alias 'staging' names no model in the registry",
        "model@0123456789ab": f"no model in the registry at {registry.root} with a digest starting '0123456789ab' (latest models: "
                              f"{made['model'][:12]} (base,",
        "nothere.md#model": "no experiment file nothere.md",
    }
    for ref, said in cases.items():
        path = based(tmp_path, ref)
        with pytest.raises(ConfigError) as caught:
            resolve(load(path), registry)
        assert str(caught.value).startswith(f"{path}:3: sft.from: ") and said in str(caught.value), caught.value
    [report] = check_files([path], bases=lambda experiment: resolve(experiment, registry))  # factory check says the same
    assert not report.ok and report.errors[0].startswith(f"{path}:3: sft.from: no experiment file")


def test_another_files_model_is_planned_at_its_fingerprint_until_it_is_computed(tmp_path, registry):
    (tmp_path / "base.md").write_text(BASE_FILE)
    path = based(tmp_path, "base.md#model")
    base = resolve(load(path), registry)
    assert base.pending and base.file == tmp_path / "base.md" and "not computed yet" in base.said
    plans = build_plan(load_file(path), registry)
    assert [(p.kind, p.status) for p in plans] == [("sft", "run"), ("model", "run")]
    assert plans[0].detail.startswith("sft starts from base.md#model = the model of base, not computed yet")
    bound = bind(load(tmp_path / "base.md"), registry)
    assert base.inputs["blend"].startswith("pending:") and base.model == bound.model


def test_a_sweep_base_needs_its_variant_named(tmp_path, registry):
    (tmp_path / "grid.md").write_text(BASE_FILE.replace("---\nThe", "sweep: {pretrain.lr: [0.001, 0.002]}\n---\nThe"))
    with pytest.raises(ConfigError, match=r"grid.md is a sweep of 2 variants; name one: grid.md@grid.lr=0.001#model, "):
        resolve(load(based(tmp_path, "grid.md#model")), registry)
    assert resolve(load(based(tmp_path, "grid.md@grid.lr=0.002#model")), registry).experiment == "grid.lr=0.002"


def test_cycles_other_stages_and_other_shapes_are_refused(tmp_path, registry):
    based(tmp_path, "two.md#model", "one.md")
    based(tmp_path, "one.md#model", "two.md")
    with pytest.raises(ConfigError, match=r"one.md:3: sft.from: two.md#model: .*two.md:3: sft.from: a cycle of `from:` between files: "):
        resolve(load(tmp_path / "one.md"), registry)
    (tmp_path / "base.md").write_text(BASE_FILE)
    with pytest.raises(ConfigError, match=r"names stage 'pretrain'; a base is an exported model: write base.md#model"):
        resolve(load(based(tmp_path, "base.md#pretrain")), registry)
    other = based(tmp_path, "base.md#model", "wide.md", extra="model: {n_layer: 2, n_head: 2, n_embd: 32, context: 64}\n")
    with pytest.raises(ConfigError, match=r"wide.md:\d+: sft.from: .*model.n_layer: 2 here, 1 in the base.*remove the `model` section"):
        resolve(load(other), registry)


@pytest.mark.parametrize(("front", "said"), [
    ("pretrain: {steps: 2}\nsft: {from: 'alias:production', steps: 2}\n", "its pretrain trains nothing it uses"),
    ("tokenizer: {vocab_size: 500}\nsft: {from: 'alias:production', steps: 2}\n", "uses that model's tokenizer"),
    ("sft: {from: 'alias:production', steps: 2}\nrl: {from: 'alias:production', steps: 2}\n", "rl starts from this file's sft"),
    ("sft: {steps: 2}\n", "add a 'pretrain' section, start from a Hugging Face checkpoint with 'model.from_hf', or from a model made elsewhere with 'sft.from'"),
    ("sft: {from: 'alias:Production', steps: 2}\n", "is not an alias name"),
    ("sft: {from: 'base.md', steps: 2}\n", "expected `experiments/<file>.md#model`"),
])
def test_a_file_that_starts_elsewhere_has_nothing_of_its_own_to_start_from(tmp_path, front, said):
    path = tmp_path / "x.md"
    path.write_text(f"---\n{front}---\n")
    with pytest.raises(ConfigError, match=rf"{path}:\d+: (sft|rl)\b") as caught:
        load(path)
    assert said in str(caught.value)


def test_only_a_file_that_starts_elsewhere_may_have_nothing_to_pretrain_on(tmp_path):
    chats = "data:\n  datasets:\n    chat:\n      source: {kind: directory, path: rows, format: jsonl, columns: [messages]}\n"
    path = tmp_path / "x.md"
    path.write_text(f"---\n{chats}pretrain: {{steps: 2}}\n---\n")
    with pytest.raises(ConfigError, match=rf"{path}:\d+: .*data: every dataset keeps row columns .* in 'data.blend'"):
        load(path)
    path.write_text(f"---\n{chats}sft: {{from: 'alias:production', steps: 2, data: {{dataset: chat, format: messages}}}}\n---\n")
    assert load(path).data.blend == ()  # it trains on its chats from the base model, which has a blend of its own


def test_a_moved_alias_plans_the_stage_again_and_says_so(tmp_path, registry):
    first, second = made_model(registry, "base", "a"), made_model(registry, "base2", "b")
    models = {m.digest: m for m in registry.manifests("model")}
    promote(registry, models[first["model"]], "production", "first", "test", "none")
    path = based(tmp_path, "alias:production")
    base = resolve(load(path), registry)
    bound = bind(load(path), registry)
    spec = plan_stage(bound, "sft", {})
    publish(registry, "sft", dict(spec.upstream), "ft", {"run.json": "ft"}, spec.fingerprint, base=base.record())  # the first run
    assert [p.status for p in build_plan([load(path)], registry)][0] == "cached"
    promote(registry, models[second["model"]], "production", "second", "test", "none")
    plan = build_plan([load(path)], registry)[0]
    assert plan.status == "run"
    assert f"alias production moved from {first['model'][:12]} to {second['model'][:12]}" in plan.detail
    earlier = registry.lookup(spec.fingerprint)
    assert earlier.inputs[BASE] == first["model"] and earlier.base["from"] == "alias:production"  # what it used, still
    assert Lineage(registry).bases(earlier.digest)[0]["digest"] == first["model"]


def test_recipes_without_from_keep_their_stage_config(tiny_path):
    experiment = load(tiny_path)
    assert experiment.base is None and experiment.bound == {}
    assert all("from" not in json.dumps(stage_config(experiment, kind)) for kind in stages_of(experiment))
