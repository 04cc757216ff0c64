"""Thousands of malformed and random configs: every one loads or ends in a located ConfigError."""

import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factory.config import load_file
from factory.errors import ConfigError

LOCATED = re.compile(r"^\S+\.md:\d+: ", re.MULTILINE)
KNOWN = ["image", "seed", "data", "tokenizer", "model", "pretrain", "eval", "resources", "name", "sweep", "extends",
         "steps", "lr", "vocab_size", "n_layer", "n_head", "n_embd", "context", "table", "pretrain.lr", "model.n_layer"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20), st.sampled_from(["local", "a.md", "self.md", "raw.x", "1e-3", "foo@sha256:" + "a" * 64]),
)
keys = st.one_of(st.sampled_from(KNOWN), st.text(min_size=1, max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)), max_leaves=25)
front_matters = st.one_of(
    st.dictionaries(keys, values, max_size=8).map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
    st.text(max_size=200),  # arbitrary text: mostly invalid YAML
)


@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(front=front_matters)
def test_random_front_matter_loads_or_fails_with_a_location(tmp_path, front):
    path = tmp_path / "self.md"
    (tmp_path / "a.md").write_text("---\nextends: self.md\n---\n")  # a cycle for `extends: a.md` to find
    path.write_text(f"---\n{front}\n---\nbody\n")
    try:
        experiments = load_file(path)
    except ConfigError as e:
        assert LOCATED.search(str(e)), str(e)
    else:
        assert experiments and all(e.name for e in experiments)


def test_an_extends_path_with_a_nul_byte_is_a_config_error(tmp_path):
    from factory.config.loader import load_text
    from factory.errors import ConfigError

    with pytest.raises(ConfigError, match="extends: expected the path of another experiment file"):
        load_text(tmp_path / "x.md", '---\nextends: "\\0"\n---\n')
