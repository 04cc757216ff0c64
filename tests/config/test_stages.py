"""Stage fingerprints and config hashes: they move with what changes the bytes, and only with that."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from factory.config import STAGES, UPSTREAM, Experiment, StageSpec, config_hash, load, load_file, plan_stage, upstream_of
from factory.config.fingerprint import canonical_json, canonical_parts, code_identity, sha256_of, sha256_of_parts, source_tree_hash
from factory.config.stages import stages_of
from factory.errors import ConfigError

EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "tiny-code-lm.md"
PINNED = "registry.example/factory@sha256:" + "cd" * 32


@pytest.fixture(scope="module")
def tiny() -> Experiment:
    return load(EXPERIMENT)


def fake_digest(name: str, salt: str = "") -> str:
    return sha256_of({"artifact": name, "salt": salt})


def fingerprints(experiment: Experiment, salt: str = "") -> dict[str, str]:
    """Plan every stage in order, feeding each a made-up digest per upstream artifact."""
    digests = {name: fake_digest(name, salt) for name in STAGES}
    return {kind: plan_stage(experiment, kind, digests).fingerprint for kind in stages_of(experiment)}


def with_section(experiment: Experiment, section: str, **changes) -> Experiment:
    """Copy-and-replace one field of one section."""
    part = getattr(experiment, section).model_copy(update=changes)
    return experiment.model_copy(update={section: part})


def changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {kind for kind in before.keys() | after.keys() if before.get(kind) != after.get(kind)}


def test_fingerprints_are_stable_for_the_same_experiment(tiny):
    again = load(EXPERIMENT)
    first = fingerprints(tiny)
    assert first == fingerprints(again)
    assert len(set(first.values())) == len(stages_of(tiny))
    assert all(re.fullmatch(r"[0-9a-f]{64}", fp) for fp in first.values())


def post_trained(tiny: Experiment) -> Experiment:
    return Experiment.model_validate({**tiny.model_dump(), "sft": {"steps": 10}, "rl": {"steps": 4}})


def test_post_training_stages_have_fingerprints_of_their_own(tiny):
    post = post_trained(tiny)
    assert stages_of(post)[-4:] == ("pretrain", "sft", "rl", "model")
    assert changed(fingerprints(tiny), fingerprints(post)) == {"sft", "rl", "model"}  # pretraining is shared; the model exports rl
    sft_lr = post.model_copy(update={"sft": post.sft.model_copy(update={"lr": 1e-4})})
    assert changed(fingerprints(post), fingerprints(sft_lr)) == {"sft"}
    kl = post.model_copy(update={"rl": post.rl.model_copy(update={"kl": 0.1})})
    assert changed(fingerprints(post), fingerprints(kl)) == {"rl"}
    placed = post.model_copy(update={"rl": post.rl.model_copy(update={"actors": 3, "learners": 2, "prompts_per_step": 12})})
    assert changed(fingerprints(post), fingerprints(placed)) == {"rl"}  # prompts_per_step is recipe...
    placed = post.model_copy(update={"rl": post.rl.model_copy(update={"actors": 2, "learners": 2})})
    assert changed(fingerprints(post), fingerprints(placed)) == set()  # ...where the ranks run is not


def test_post_training_needs_a_pretrained_model(tiny):
    data = {**tiny.model_dump(), "pretrain": None, "eval": None, "rl": {"steps": 4}}
    with pytest.raises(ValueError, match="'rl' fine-tunes a model: add a 'pretrain' section, start from a Hugging Face checkpoint with 'model.from_hf', or from a model made elsewhere with 'rl.from'"):
        Experiment.model_validate(data)


def test_rl_knobs_that_cannot_work_are_refused_with_what_to_change(tiny):
    data = {**tiny.model_dump(), "rl": {"steps": 4, "max_new_tokens": 100}}
    with pytest.raises(ValueError, match=r"rl.max_new_tokens \(100\) must leave room for the prompt: at most half of model.context \(128\)"):
        Experiment.model_validate(data)
    with pytest.raises(ValueError, match=r"checkpoint_every \(3\) must be a multiple of log_every \(5\)"):
        Experiment.model_validate({**tiny.model_dump(), "rl": {"steps": 4, "checkpoint_every": 3, "log_every": 5}})
    with pytest.raises(ValueError, match=r"prompts_per_step \(3\) must be divisible by actors \(2\)"):
        Experiment.model_validate({**tiny.model_dump(), "rl": {"steps": 4, "prompts_per_step": 3, "actors": 2}})


def test_learning_rate_changes_only_the_pretrain_fingerprint(tiny):
    variant = with_section(tiny, "pretrain", lr=0.01)
    assert variant.pretrain.lr == 0.01 and tiny.pretrain.lr == 0.003
    assert changed(fingerprints(tiny), fingerprints(variant)) == {"pretrain"}


def test_model_width_changes_pretrain(tiny):
    variant = with_section(tiny, "model", n_embd=256)
    assert changed(fingerprints(tiny), fingerprints(variant)) == {"pretrain"}


def test_tokenizer_config_changes_only_the_tokenizer_fingerprint(tiny):
    variant = with_section(tiny, "tokenizer", vocab_size=4096)
    assert changed(fingerprints(tiny), fingerprints(variant)) == {"tokenizer"}


def test_the_validation_share_changes_only_the_blend_fingerprint(tiny):
    variant = with_section(tiny, "data", validation_percent=10)
    assert changed(fingerprints(tiny), fingerprints(variant)) == {"blend"}


def with_dataset(experiment: Experiment, name: str, section: str, **changes) -> Experiment:
    """Copy-and-replace one field of one section of one dataset."""
    dataset = experiment.data.datasets[name]
    replaced = dataset.model_copy(update={section: getattr(dataset, section).model_copy(update=changes)})
    data = experiment.data.model_copy(update={"datasets": {**experiment.data.datasets, name: replaced}})
    return experiment.model_copy(update={"data": data})


@pytest.mark.parametrize(
    ("section", "changes", "stage"),
    [("source", {"max_file_bytes": 5000}, "raw_datasets"), ("dedup", {"near_threshold": 0.5}, "deduped_datasets"),
     ("filters", {"min_bytes": 10}, "filtered_datasets")],
)
def test_each_data_step_has_its_own_fingerprint(tiny, section, changes, stage):
    variant = with_dataset(tiny, "stdlib", section, **changes)
    assert changed(fingerprints(tiny), fingerprints(variant)) == {stage}


def test_blend_weights_change_the_blend_not_the_datasets(tiny):
    parts = tuple(part.model_copy(update={"weight": 1.0}) for part in tiny.data.blend)
    variant = tiny.model_copy(update={"data": tiny.data.model_copy(update={"blend": parts})})
    assert changed(fingerprints(tiny), fingerprints(variant)) == {"blend"}


def test_packing_changes_training_not_the_tokenizer(tiny):
    variant = with_section(tiny, "data", packing="next-fit")
    assert changed(fingerprints(tiny), fingerprints(variant)) == {"pretrain"}


def test_seed_changes_every_seeded_stage_but_not_raw_or_filtered_data(tiny):
    variant = tiny.model_copy(update={"seed": 7})
    assert changed(fingerprints(tiny), fingerprints(variant)) == {"deduped_datasets", "tokenizer", "pretrain"}


@pytest.mark.parametrize("changes", [{"queue": "gpu-large"}, {"processes_per_node": 8}, {"nodes": 4}])
def test_placement_does_not_change_any_fingerprint(tiny, changes):
    variant = with_section(tiny, "resources", **changes)
    assert variant.resources != tiny.resources
    assert fingerprints(variant) == fingerprints(tiny)


def test_name_and_description_do_not_change_any_fingerprint(tiny):
    variant = tiny.model_copy(update={"name": "renamed", "description": "other prose"})
    assert fingerprints(variant) == fingerprints(tiny)


def test_pinned_image_changes_every_fingerprint(tiny):
    full = post_trained(tiny)
    variant = full.model_copy(update={"image": PINNED})
    assert changed(fingerprints(full), fingerprints(variant)) == set(STAGES)


@pytest.mark.parametrize("kind", [k for k in STAGES if UPSTREAM[k]])
def test_an_upstream_digest_changes_the_fingerprint(tiny, kind):
    tiny = post_trained(tiny)
    digests = {name: fake_digest(name) for name in STAGES}
    before = plan_stage(tiny, kind, digests)
    parent = UPSTREAM[kind][0]
    after = plan_stage(tiny, kind, {**digests, parent: fake_digest(parent, "rebuilt")})
    assert after.fingerprint != before.fingerprint
    assert after.upstream[parent] == fake_digest(parent, "rebuilt")


def test_digests_a_stage_does_not_read_are_ignored(tiny):
    only_blend = plan_stage(tiny, "tokenizer", {"blend": fake_digest("blend")})
    with_extra = plan_stage(tiny, "tokenizer", {"blend": fake_digest("blend"), "model": fake_digest("model")})
    assert dict(with_extra.upstream) == {"blend": fake_digest("blend")}
    assert with_extra.fingerprint == only_blend.fingerprint


def test_a_blend_of_pinned_tables_needs_no_dataset_stages(tiny):
    data = tiny.data.model_validate({"datasets": {}, "blend": [{"table": "filtered.stdlib@v1"}]})
    pinned = tiny.model_copy(update={"data": data})
    assert stages_of(pinned)[:2] == ("blend", "tokenizer")
    spec = plan_stage(pinned, "blend", {})
    assert dict(spec.upstream) == {} and spec.config["blend"][0]["table"] == "filtered.stdlib@v1"


@pytest.mark.parametrize("kind", [k for k in STAGES if UPSTREAM[k]])
def test_planning_without_an_upstream_digest_is_a_config_error(tiny, kind):
    tiny = post_trained(tiny)
    digests = {name: fake_digest(name) for name in STAGES}
    missing = upstream_of(tiny, kind)[-1]  # what this recipe's stage reads (sft reads the filtered datasets only for sft.data.dataset)
    del digests[missing]
    with pytest.raises(ConfigError, match=missing):
        plan_stage(tiny, kind, digests)


def test_unknown_stage_is_a_config_error(tiny):
    with pytest.raises(ConfigError, match="unknown stage 'finetune'"):
        plan_stage(tiny, "finetune", {})


def test_stage_spec_round_trips_through_json(tiny):
    spec = plan_stage(tiny, "pretrain", {name: fake_digest(name) for name in STAGES})
    data = json.loads(json.dumps(spec.to_json()))
    again = StageSpec.from_json(data)
    assert again.fingerprint == spec.fingerprint
    assert again.to_json() == spec.to_json()
    assert data["config"]["pretrain"]["lr"] == 0.003 and "resources" not in data["config"]


def test_config_hash_ignores_name_and_description(tiny):
    renamed = tiny.model_copy(update={"name": "renamed", "description": "other prose"})
    assert config_hash(renamed) == config_hash(tiny)
    assert re.fullmatch(r"[0-9a-f]{16}", config_hash(tiny))


@pytest.mark.parametrize(
    ("section", "changes"),
    [("pretrain", {"lr": 0.01}), ("resources", {"queue": "gpu-large"}), ("eval", {"max_bytes": 1000})],
)
def test_config_hash_changes_with_any_recipe_or_placement_field(tiny, section, changes):
    assert config_hash(with_section(tiny, section, **changes)) != config_hash(tiny)


def test_canonical_json_is_sorted_and_compact():
    assert canonical_json({"b": 1, "a": [1, {"d": 2, "c": "é"}]}) == '{"a":[1,{"c":"é","d":2}],"b":1}'
    assert canonical_json({"x": 1, "y": 2}) == canonical_json({"y": 2, "x": 1})
    assert sha256_of({"x": 1, "y": 2}) == sha256_of({"y": 2, "x": 1})
    assert sha256_of({"x": 1}) != sha256_of({"x": 2})


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4), max_leaves=12)
"""JSON values, texts with quotes, escapes and characters beyond ASCII among them."""


@given(st.dictionaries(st.text(), JSON, max_size=6), st.dictionaries(st.text(), JSON, max_size=6))
def test_a_mapping_hashed_from_its_entries_serialized_apart_has_the_digest_of_the_whole(shared, own):
    """An evaluation's fingerprint joins its training's entries, serialized once, with its own (`sha256_of_parts`): the
    digest must be the one hashing the whole mapping gives, or every result computed before would be stale."""
    whole = {**own, **shared}
    assert sha256_of_parts({**canonical_parts(own), **canonical_parts(shared)}) == sha256_of(whole)


def test_canonical_json_refuses_nan():
    with pytest.raises(ValueError):
        canonical_json({"loss": float("nan")})


def test_code_identity_is_the_image_when_pinned():
    assert code_identity(PINNED) == PINNED


def test_code_identity_of_local_hashes_the_source_tree():
    identity = code_identity("local")
    assert re.fullmatch(r"local:[0-9a-f]{16}", identity)
    assert code_identity("local") == identity


def test_source_tree_hash_follows_python_sources_only(tmp_path):
    for name, text in (("a", "x = 1\n"), ("b", "x = 2\n")):
        (tmp_path / name / "__pycache__").mkdir(parents=True)
        (tmp_path / name / "mod.py").write_text(text)
    (tmp_path / "b" / "README.md").write_text("prose is not code")
    (tmp_path / "b" / "__pycache__" / "stale.py").write_text("ignored")
    assert source_tree_hash(tmp_path / "a") != source_tree_hash(tmp_path / "b")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "mod.py").write_text("x = 2\n")
    assert source_tree_hash(tmp_path / "c") == source_tree_hash(tmp_path / "b")


def test_the_site_packages_identity_does_not_depend_on_where_python_starts(tmp_path):
    import subprocess
    import sys

    code = ("from factory.config.data_sections import SourceConfig; from factory.config.sources import source_files; "
            "print(source_files(SourceConfig(kind='site-packages', include=('yaml/**/*.py',))).digest)")
    repo = Path(__file__).resolve().parents[2]
    here = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True).stdout
    elsewhere = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True).stdout  # as installed
    assert here == elsewhere and len(here.strip()) == 32


def test_a_dataset_the_blend_does_not_use_enters_no_fingerprint(tiny_path):
    experiment = load(tiny_path)
    data = experiment.data.model_dump(mode="json")
    data["datasets"]["notes"] = {"source": {"kind": "python-stdlib", "include": ["json/*.py"]}}
    wider = experiment.model_copy(update={"data": experiment.data.model_validate(data)})
    assert set(wider.data.datasets) == {*experiment.data.datasets, "notes"}
    digests: dict[str, str] = {}
    for kind in stages_of(experiment):
        upstream = {name: digests[name] for name in upstream_of(experiment, kind)}
        assert plan_stage(wider, kind, upstream).fingerprint == plan_stage(experiment, kind, upstream).fingerprint, kind
        digests[kind] = plan_stage(experiment, kind, upstream).fingerprint

    data["blend"] = [*data["blend"], {"dataset": "notes", "weight": 1}]
    blended = experiment.model_copy(update={"data": experiment.data.model_validate(data)})
    assert plan_stage(blended, "raw_datasets", {}).fingerprint != plan_stage(experiment, "raw_datasets", {}).fingerprint


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "experiments").glob("*.md")), ids=lambda p: p.stem)
def test_each_stage_reads_its_settings_back_typed_exactly_as_they_were_fingerprinted(path):
    """The stage process parses a spec's config with its kind's settings type: nothing is lost or added on the way."""
    from factory.config.kinds import stage_kind
    from factory.config.stages import stage_config

    for experiment in load_file(path):
        for kind in stages_of(experiment):
            config = json.loads(json.dumps(stage_config(experiment, kind)))  # as the stage process receives it
            settings = stage_kind(kind).read_settings(config)
            assert settings.model_dump(mode="json") == config, kind


def test_the_evaluation_kind_is_registered_but_in_no_experiments_chain(tiny):
    from factory.config.kinds import registered_kinds, stage_kind, stage_kinds

    assert stage_kind("evaluation").scope == "checkpoints" and "evaluation" in [k.name for k in registered_kinds()]
    assert "evaluation" not in STAGES and "evaluation" not in [k.name for k in stage_kinds()]
    with pytest.raises(ConfigError, match="has no evaluation stage"):
        plan_stage(tiny, "evaluation", {})
