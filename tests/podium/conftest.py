"""A factory store for Podium: a fine-tuning table with good and broken samples in two versions, and two checkpoints."""

import hashlib
import json
import logging
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from factory.config.schema import ModelConfig, TokenizerConfig
from factory.data.catalog import CatalogConfig, open_catalog
from factory.podium.browse import Browser
from factory.data.tables import write_version
from factory.models.build import build_model
from factory.models.tokenizer import train_tokenizer
from factory.registry import ArtifactStore, Provenance

TABLE = "sft.samples"
SCRIPT = "<script>alert('cell')</script>"
ATTRIBUTE = '"><img src=x onerror=alert(1)>'
HUGE = 60_000
MODEL = {"n_layer": 1, "n_head": 2, "n_embd": 32, "context": 64}
SAMPLE_SCHEMA = pa.schema([
    pa.field("id", pa.string(), nullable=False),
    pa.field("label", pa.string(), nullable=False),
    pa.field("prompt", pa.string(), nullable=False),
    pa.field("completion", pa.string(), nullable=False),
    pa.field("metadata", pa.string(), nullable=False),
    pa.field("score", pa.int64(), nullable=False),
    pa.field("bytes", pa.int64(), nullable=False),
    pa.field("sha256", pa.string(), nullable=False),
])


def sample(i: int, prompt: str, completion: str, metadata: str, label: str = "ok") -> dict:
    body = prompt + completion
    return {"id": f"s{i:04d}", "label": label, "prompt": prompt, "completion": completion, "metadata": metadata, "score": i,
            "bytes": len(body.encode()), "sha256": hashlib.sha256(body.encode()).hexdigest()}


def samples() -> list[dict]:
    """Version 1: special rows first, then ordinary ones."""
    rows = [
        sample(0, "def add(a, b):\n    return a + b\nassert add(1, 2) ==", " 3\n", json.dumps({"source": "mined", "difficulty": 1})),
        sample(1, "def neg(x):\n    return -x\nassert neg(4) ==", " -4\n", '{"source": "mined", "difficulty" 2}', label="broken"),
        sample(2, SCRIPT, ATTRIBUTE, json.dumps({"note": SCRIPT}), label="hostile"),
        sample(3, "x" * HUGE, "y", json.dumps({"source": "huge"}), label="huge"),
    ]
    rows += [sample(i, f"def f{i}(x):\n    return x * {i}\nassert f{i}(2) ==", f" {2 * i}\n", json.dumps({"i": i})) for i in range(4, 130)]
    return rows


@pytest.fixture(scope="session")
def store(tmp_path_factory) -> Path:
    """A `.factory`-like root: catalog under iceberg/, registry under registry/."""
    root = tmp_path_factory.mktemp("podium-store")
    catalog = open_catalog(CatalogConfig.local(root / "iceberg"))
    log = logging.getLogger("test.podium")
    first = samples()
    write_version(catalog, TABLE, pa.Table.from_pylist(first, schema=SAMPLE_SCHEMA), log, schema=SAMPLE_SCHEMA)
    # Version 2: one sample fixed, one dropped, two added.
    second = [r for r in first if r["id"] != "s0005"]
    second[1] = sample(1, second[1]["prompt"], second[1]["completion"], '{"source": "mined", "difficulty": 2}')
    second += [sample(i, f"print({i})", f" # {i}\n", "{}") for i in (900, 901)]
    write_version(catalog, TABLE, pa.Table.from_pylist(second, schema=SAMPLE_SCHEMA), log, schema=SAMPLE_SCHEMA)
    publish_checkpoints(ArtifactStore(root / "registry"), [r["prompt"] + r["completion"] for r in first[4:]])
    return root


def publish_checkpoints(registry: ArtifactStore, texts: list[str]) -> None:
    """A tokenizer artifact and two `pretrain` artifacts of one checkpoint each (untrained weights of two seeds)."""
    provenance = Provenance(experiment="podium-test", config_hash="0" * 12, git_commit="0" * 40)
    with registry.staging() as out:
        tokenizer = train_tokenizer(texts, TokenizerConfig.model_validate({"vocab_size": 320, "min_frequency": 1}))
        tokenizer.save(str(out / "tokenizer.json"))
        tok = registry.publish(out, kind="tokenizer", fingerprint="podium-tokenizer", config={}, inputs={}, code="test",
                               provenance=provenance, summary={})
    for seed in (1, 2):
        model = build_model(ModelConfig.model_validate(MODEL), tokenizer.get_vocab_size(), seed)
        with registry.staging() as out:
            path = out / "step_000010.pt"
            torch.save({"model": model.state_dict()}, path)
            data = path.read_bytes()
            record = {"step": 10, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "metrics": {"loss": 5.0}}
            (out / "step_000010.json").write_text(json.dumps(record))
            registry.publish(out, kind="pretrain", fingerprint=f"podium-pretrain-{seed}", config={"model": MODEL, "seed": seed},
                             inputs={"tokenizer": tok.digest}, code="test",
                             provenance=Provenance(experiment=f"podium-seed{seed}", config_hash="0" * 12, git_commit="0" * 40), summary={})


@pytest.fixture(scope="module")
def browser(store):
    """Podium's reads over the store's catalog."""
    return Browser(open_catalog(CatalogConfig.local(store / "iceberg")))


def versions(browser) -> tuple[int, int]:
    """The snapshot ids of the samples table's v1 and v2."""
    info = browser.info(TABLE)
    return info.snapshot("v1").id, info.snapshot("v2").id
