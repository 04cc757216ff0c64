"""Blends over real table versions: datasets and pinned `table@tag`s, stable identity, clear errors."""

import pytest

from factory.config.data_sections import DataConfig
from factory.data.blend import Blend, build_blend
from factory.data.tables import reject_version, write_content, write_version
from factory.errors import ArtifactError
from tests.data.conftest import LOG, documents


def test_a_blend_names_dataset_and_pinned_versions_by_content(catalog):
    mine = write_version(catalog, "filtered.mine", documents("mine", {"a.py": "a = 1\n"}), LOG)
    theirs = write_version(catalog, "curated.theirs", documents("theirs", {"b.py": "b = 1\n", "c.py": "c = 1\n"}), LOG, tag="gold")
    data = DataConfig.model_validate(
        {"datasets": {"mine": {}}, "blend": [{"dataset": "mine", "weight": 3}, {"table": "curated.theirs@gold", "mode": "finite"}]}
    )
    blend = build_blend(catalog, data, {"mine": mine})
    assert [(p.table, p.tag, p.version, p.rows, p.mode) for p in blend.parts] == [
        ("filtered.mine", mine.content_tag, "v1", 1, "oversample"),
        ("curated.theirs", theirs.content_tag, "gold", 2, "finite"),
    ]
    assert blend.weights == (0.75, 0.25)
    assert Blend.from_json(blend.to_json()) == blend
    reweighted = build_blend(catalog, data.model_copy(update={"blend": tuple(p.model_copy(update={"weight": 1.0}) for p in data.blend)}), {"mine": mine})
    assert reweighted.fingerprint != blend.fingerprint
    assert build_blend(catalog, data, {"mine": mine}).fingerprint == blend.fingerprint


def test_a_missing_pinned_version_is_an_error_naming_the_tags(catalog):
    write_version(catalog, "curated.theirs", documents("theirs", {"b.py": "b = 1\n"}), LOG)
    data = DataConfig.model_validate({"datasets": {}, "blend": [{"table": "curated.theirs@v7"}]})
    with pytest.raises(ArtifactError, match=r"no version tagged 'v7'; its tags: v1"):
        build_blend(catalog, data, {})


def test_no_pin_and_no_dataset_part_reaches_a_version_its_checks_rejected(catalog):
    refused = reject_version(catalog, write_content(catalog, "filtered.code", documents("code", {"a.py": "x\n", "b.py": "x\n"})), LOG)
    for ref in (refused.ref, f"filtered.code@{refused.content_tag}"):
        data = DataConfig.model_validate({"datasets": {}, "blend": [{"table": ref}]})
        with pytest.raises(ArtifactError, match=r"its dataset checks rejected; pin a version that passed \(none has yet\)"):
            build_blend(catalog, data, {})
    passed = write_version(catalog, "filtered.code", documents("code", {"a.py": "x\n"}), LOG)
    assert passed.tag == "v1"
    data = DataConfig.model_validate({"datasets": {}, "blend": [{"table": refused.ref}]})
    with pytest.raises(ArtifactError, match="pin a version that passed, such as filtered.code@v1"):
        build_blend(catalog, data, {})
    mine = DataConfig.model_validate({"datasets": {"code": {}}, "blend": [{"dataset": "code"}]})
    with pytest.raises(ArtifactError, match="failed the dataset checks"):
        build_blend(catalog, mine, {"code": refused})
    assert build_blend(catalog, mine, {"code": passed}).parts[0].version == "v1"
