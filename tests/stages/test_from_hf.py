"""An instruction-tuned Hugging Face checkpoint (`model.from_hf`) through the stage process: SFT renders its rows with the
checkpoint's chat template unless the file gives one, the model stage exports that template with the checkpoint's special
tokens (after continued pretraining too), and the evaluation stage scores an SFT checkpoint with the imported tokenizer
and the file's blend."""

import hashlib
import json
from pathlib import Path

import pytest

from factory.config import load_file, plan_stage
from factory.data.catalog import CatalogConfig
from factory.registry.layout import CHAT_TEMPLATE_FILE, MODEL_CONFIG, RUN_FILE, TOKENIZER_CONFIG
from factory.registry.store import ArtifactStore
from factory.runtime.__main__ import main
from factory.runtime.request import StageRequest
from factory.stages.evaluation import CheckpointRef, EvalItem, batch_provenance, batch_spec
from factory.stages.scoring import trained_chat_template
from tests.models.hf_checkpoints import CHATML, IMPORTED, save_llama, write_sources
from tests.stages.test_sft_data import run_all

pytestmark = pytest.mark.usefixtures("no_pipes")
SFT_ON_CHATS = "sft: {{steps: 2, batch_size: 4, log_every: 1, data: {{dataset: chat, format: messages{template}}}}}"
OWN_TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
EVAL = "\neval: {benchmarks: [val_bpb], max_bytes: 4000, batch_size: 4}"


@pytest.fixture
def imported(tmp_path, monkeypatch) -> Path:
    """A ChatML checkpoint of four distinct special tokens, with code to pretrain on and chats to fine-tune on."""
    monkeypatch.setenv("FACTORY_DATA_ROOTS", str(tmp_path))
    save_llama(tmp_path / "hf", chat=True)
    write_sources(tmp_path, files=20)
    return tmp_path


def recipe(root: Path, training: str) -> Path:
    path = root / "imported.md"
    path.write_text(IMPORTED.format(root=root, training=training + EVAL, what="instruction-tuned"))
    return path


def exported_tokens(model: Path) -> tuple:
    """The exported model's special token ids, tokenizer config's special tokens and chat template."""
    config, settings = (json.loads((model / name).read_text()) for name in (MODEL_CONFIG, TOKENIZER_CONFIG))
    return ((config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]),
            tuple(settings[f"{name}_token"] for name in ("bos", "eos", "pad", "unk")), settings["chat_template"])


@pytest.mark.parametrize("own", [False, True], ids=["checkpoint-template", "file-template"])
def test_sft_renders_with_the_checkpoints_template_unless_the_file_gives_one(imported, own):
    template = f", chat_template: {json.dumps(OWN_TEMPLATE)}" if own else ""
    artifacts = run_all(imported, recipe(imported, SFT_ON_CHATS.format(template=template)))
    [sft] = ArtifactStore(imported / "registry").manifests("sft")
    said = "sft.data.chat_template" if own else f"{(imported / 'hf').resolve()}/chat_template.jinja"
    assert sft.summary["chat_template"] == said  # which template, and from where
    used = OWN_TEMPLATE if own else CHATML
    assert (artifacts["sft"] / CHAT_TEMPLATE_FILE).read_text() == (artifacts["model"] / CHAT_TEMPLATE_FILE).read_text() == used
    assert exported_tokens(artifacts["model"]) == ((0, 1, 2), ("<s>", "<|im_end|>", "<pad>", "<unk>"), used)


def test_continued_pretraining_exports_the_checkpoints_template_and_tokens(imported):
    artifacts = run_all(imported, recipe(imported, "pretrain: {steps: 2, batch_size: 2, warmup_steps: 0, checkpoint_every: 0}"))
    assert (artifacts["model"] / CHAT_TEMPLATE_FILE).read_text() == CHATML
    assert exported_tokens(artifacts["model"]) == ((0, 1, 2), ("<s>", "<|im_end|>", "<pad>", "<unk>"), CHATML)


def test_the_evaluation_stage_scores_an_sft_checkpoint_of_an_imported_model(imported):
    path = recipe(imported, SFT_ON_CHATS.format(template=""))
    artifacts = run_all(imported, path)
    [experiment] = load_file(path)
    registry = ArtifactStore(imported / "registry")
    [sft], [blend] = registry.manifests("sft"), registry.manifests("blend")
    spec = plan_stage(experiment, "sft", sft.inputs)
    assert "pretrain" not in spec.upstream and spec.fingerprint == sft.fingerprint  # the tokenizer is the checkpoint's
    final = artifacts["sft"] / json.loads((artifacts["sft"] / RUN_FILE).read_text())["final"]
    checkpoint = CheckpointRef(key="imported__sft-000002", experiment="imported", step=2, tokens_seen=1, path=str(final),
                               sha256=hashlib.sha256(final.read_bytes()).hexdigest(), training=spec.to_json(),
                               eval=experiment.eval.model_dump(include={"max_bytes", "batch_size"}), git_commit="0" * 40)
    assert trained_chat_template(registry, checkpoint) == CHATML  # what a chat-prompted benchmark renders its prompts with
    items = (EvalItem(partition=f"val_bpb|{checkpoint.key}", benchmark="val_bpb", checkpoint=checkpoint),)
    batch = batch_spec(items, "test")
    request = StageRequest(spec=batch, registry=str(registry.root), catalog=CatalogConfig.local(imported / "catalog"),
                           provenance=batch_provenance(items, batch.config, "run-1"))
    assert main([str(request.write(imported / "evaluation.json"))]) == 0
    [result] = registry.manifests("evaluations")
    assert result.summary["checkpoint"] == checkpoint.key and result.summary["data"].startswith(f"blend:{blend.digest[:16]}+")
    assert result.summary["count"] > 500 and 0 < result.summary["value"] < 20  # bits per byte of the held-out code, every byte read
