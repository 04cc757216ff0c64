"""The deploy profile's catalog: Iceberg tables in PostgreSQL, committed to by concurrent processes without losing a commit."""

import json
import subprocess
import sys
from pathlib import Path

from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.prompts import read_prompts

WRITER = """
import logging, sys, pyarrow as pa
from pathlib import Path
from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.prompts import save_prompt
from factory.data.tables import write_version
from tests.data.conftest import documents
name, root, count = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
catalog = open_catalog(CatalogConfig.at(root))
tags = [save_prompt(catalog, f"{name} prompt {i}", f"from {name}") for i in range(count)]
version = write_version(catalog, f"raw.{name}", documents(name, {f"{name}.py": "x = 1\\n"}), logging.getLogger(name))
print(" ".join(tags), version.ref)
"""
SAVES = 6


def test_two_processes_commit_to_one_postgres_catalog_and_lose_nothing(postgres, tmp_path, monkeypatch):
    monkeypatch.setenv("FACTORY_DATABASE_URL", postgres)
    config = CatalogConfig.at(tmp_path)
    assert config.uri.startswith("postgresql+psycopg2://") and config.warehouse.startswith("file://")
    repo = Path(__file__).resolve().parents[2]
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, name, str(tmp_path), str(SAVES)], cwd=repo, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for name in ("alpha", "beta")]
    outputs = [w.communicate(timeout=300) for w in writers]
    assert all(w.returncode == 0 for w in writers), [err for _, err in outputs]
    catalog = open_catalog(config)
    tags = sorted({tag for out, _ in outputs for tag in out.split()[:-1]}, key=lambda t: int(t[1:]))
    prompts = [p["prompt"] for p in read_prompts(catalog, tags[-1])]
    assert sorted(prompts) == sorted(f"{name} prompt {i}" for name in ("alpha", "beta") for i in range(SAVES)), "no commit is lost"
    assert [out.split()[-1] for out, _ in outputs] == ["raw.alpha@v1", "raw.beta@v1"]
    assert sorted(".".join(t) for t in catalog.list_tables("raw")) == ["raw.alpha", "raw.beta"]
    assert not (tmp_path / "iceberg" / "catalog.db").exists(), "nothing went to the embedded sqlite catalog"
    assert json.loads(json.dumps(config.to_json()))["uri"] == config.uri
