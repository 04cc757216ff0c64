"""The settings file: factory.toml or [tool.factory], relative to its directory, under the environment; wrong is file:line."""

from pathlib import Path

import pytest

from factory.config.settings import Settings, load_settings
from factory.errors import ConfigError


def repository(tmp_path: Path, name: str = "repo", **files: str) -> Path:
    root = tmp_path / name
    (root / ".git").mkdir(parents=True)
    (root / "experiments").mkdir()
    for file, text in files.items():
        (root / file.replace("__", ".")).write_text(text)
    return root


def test_without_a_file_the_root_is_the_repositorys_and_the_only_data_root_is_the_repository(tmp_path):
    repo = repository(tmp_path)
    settings = load_settings(repo / "experiments" / "x.md", environ={})
    assert settings == Settings(repository=repo.resolve(), file=None, root=(repo / ".factory").resolve(), data_roots=(repo.resolve(),))
    assert Path.home().resolve() not in settings.data_roots


def test_a_file_outside_any_repository_reads_its_own_directory(tmp_path):
    (tmp_path / "house").mkdir()
    experiment = tmp_path / "house" / "style.md"
    experiment.write_text("---\n---\n")
    settings = load_settings(experiment, environ={})
    assert settings.repository == settings.data_roots[0] == (tmp_path / "house").resolve()
    assert settings.root == (tmp_path / "house" / ".factory").resolve()


def test_factory_toml_paths_are_relative_to_its_directory_and_the_environment_overrides_it(tmp_path):
    repo = repository(tmp_path, factory__toml='root = "state"\ndata_roots = ["../shared", "/srv/corpora"]\n'
                                              'benchmarks = ["mypkg.benchmarks"]\n\n[pools]\ntraining = 2\n')
    settings = load_settings(repo / "experiments", environ={})
    assert settings.file == repo / "factory.toml" and settings.root == (repo / "state").resolve()
    assert settings.data_roots == ((tmp_path / "shared").resolve(), Path("/srv/corpora"))
    assert settings.benchmarks == ("mypkg.benchmarks",) and settings.pools == {"training": 2}
    env = {"FACTORY_ROOT": str(tmp_path / "elsewhere"), "FACTORY_DATA_ROOTS": str(tmp_path), "FACTORY_BENCHMARKS": "",
           "FACTORY_POOL_TRAINING": "3"}
    over = load_settings(repo, environ=env)
    assert over.root == (tmp_path / "elsewhere").resolve() and over.data_roots == (tmp_path.resolve(),)
    assert over.benchmarks == () and over.pools == {"training": 3}
    assert over.environ()["FACTORY_POOL_TRAINING"] == "3" and over.environ()["FACTORY_DATA_ROOTS"] == str(tmp_path.resolve())


def test_a_tool_factory_table_in_pyproject_is_read_when_there_is_no_factory_toml(tmp_path):
    repo = repository(tmp_path, pyproject__toml='[project]\nname = "x"\n\n[tool.factory]\nroot = "/var/factory"\n\n'
                                                '[tool.factory.pools]\nevaluation = 4\n')
    settings = load_settings(repo, environ={})
    assert settings.file == repo / "pyproject.toml" and settings.root == Path("/var/factory") and settings.pools == {"evaluation": 4}
    (repo / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert load_settings(repo, environ={}).file is None


@pytest.mark.parametrize(("text", "line", "says"), [
    ('root = ".factory"\n\ndata_root = ["/data"]\n', 3, "data_root: unknown setting; the settings are root, data_roots"),
    ('root = ".factory"\ndata_roots = "/data"\n', 2, "data_roots: a list of strings"),
    ('[pools]\ntraining = 1\ngpu = 2\n', 3, "pools.gpu: unknown pool; the pools are training, evaluation"),
    ('[pools]\ntraining = true\n', 2, "pools.training: a pool's limit is a whole number of slots"),
    ('pools = {training = -1}\n', 1, "pools.training: a pool's limit is a whole number of slots"),
    ('root = ".factory"\nroot = "again"\n', 2, "fix the TOML"),
    ('root = \n', 1, "fix the TOML"),
])
def test_a_bad_settings_file_is_a_config_error_at_its_line(tmp_path, text, line, says):
    repo = repository(tmp_path, factory__toml=text)
    with pytest.raises(ConfigError) as raised:
        load_settings(repo, environ={})
    assert str(raised.value).startswith(f"{repo / 'factory.toml'}:{line}: ") and says in str(raised.value), str(raised.value)
    assert raised.value.exit_code == 2


def test_a_bad_key_of_tool_factory_is_located_in_pyproject(tmp_path):
    repo = repository(tmp_path, pyproject__toml='[project]\nname = "x"\n\n[tool.factory]\nroot = 3\n')
    with pytest.raises(ConfigError, match=r"pyproject.toml:5: root: a directory"):
        load_settings(repo, environ={})


def test_a_pool_limit_from_the_environment_must_be_a_number(tmp_path):
    with pytest.raises(ConfigError, match="FACTORY_POOL_EVALUATION='two': a pool's limit is a whole number"):
        load_settings(repository(tmp_path), environ={"FACTORY_POOL_EVALUATION": "two"})


def test_an_edited_file_is_read_again(tmp_path):
    repo = repository(tmp_path, factory__toml='root = "one"\n')
    assert load_settings(repo, environ={}).root.name == "one"
    (repo / "factory.toml").write_text('root = "second"\n')
    assert load_settings(repo, environ={}).root.name == "second"
