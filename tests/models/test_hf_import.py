"""Import of a Hugging Face Llama checkpoint saved by `transformers` itself: the factory's llama computes its logits, and
import then export gives every tensor back byte for byte, and an instruction-tuned model's special tokens and chat
template as they were."""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from factory.config.hf_checkpoint import read_checkpoint
from factory.config.schema import ModelConfig
from factory.errors import StageFailed
from factory.models.build import hugging_face_layout, new_model
from factory.models.hf_export import export_hugging_face
from factory.models.hf_import import copy_tokenizer, import_weights
from factory.models.tokenizer import end_of_text, load_tokenizer
from tests.models.hf_checkpoints import CHAT_TOKENS, CHATML, TEXTS, save_llama

TOLERANCE = 1e-5


@pytest.fixture(autouse=True)
def roots(monkeypatch, tmp_path):
    monkeypatch.setenv("FACTORY_DATA_ROOTS", str(tmp_path))


@pytest.mark.parametrize("tie, kv_heads", [(False, 2), (True, 1), (False, 4)], ids=["untied-gqa", "tied-mqa", "untied-mha"])
def test_import_then_export_gives_every_tensor_back_and_the_same_logits(tmp_path, tie, kv_heads):
    theirs = save_llama(tmp_path / "hf", tie=tie, kv_heads=kv_heads).eval()
    config = ModelConfig.model_validate({"from_hf": str(tmp_path / "hf")})
    weights = import_weights(config.from_hf)
    ours = new_model(config, 320)
    ours.load_state_dict(weights)  # strict: every tensor of the factory's llama, and no other
    tokens = torch.tensor([load_tokenizer(tmp_path / "hf" / "tokenizer.json").encode(TEXTS[7] + TEXTS[11]).ids[:100]])
    with torch.no_grad():
        assert (ours.eval()(tokens) - theirs(tokens).logits).abs().max().item() <= TOLERANCE

    (tmp_path / "tokenizer").mkdir()
    copy_tokenizer(config.from_hf, tmp_path / "tokenizer")
    (tmp_path / "out").mkdir()
    layout = hugging_face_layout(config, ours.state_dict(), 320)
    export_hugging_face(layout, ours.state_dict(), tmp_path / "out", tokenizer=tmp_path / "tokenizer" / "tokenizer.json",
                        context=config.context, record={"model": config.model_dump(mode="json")})
    before, after = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert before.keys() == after.keys()
    for name, tensor in before.items():
        assert tensor.dtype == after[name].dtype and tensor.shape == after[name].shape, name
        assert tensor.numpy().tobytes() == after[name].numpy().tobytes(), name
    eos = load_tokenizer(tmp_path / "out" / "tokenizer.json").token_to_id("</s>")
    assert end_of_text(load_tokenizer(tmp_path / "out" / "tokenizer.json"), tmp_path / "out" / "tokenizer.json") == eos


def test_a_bf16_checkpoint_is_widened_exactly(tmp_path):
    save_llama(tmp_path / "hf", dtype=torch.bfloat16)
    config = ModelConfig.model_validate({"from_hf": str(tmp_path / "hf")})
    stored = load_file(tmp_path / "hf" / "model.safetensors")
    weights = import_weights(config.from_hf)
    assert all(t.dtype == torch.float32 for t in weights.values())
    assert torch.equal(weights["layers.1.mlp.down_proj.weight"].to(torch.bfloat16), stored["model.layers.1.mlp.down_proj.weight"])


def test_files_changed_after_planning_stop_the_stage(tmp_path):
    save_llama(tmp_path / "hf")
    config = ModelConfig.model_validate({"from_hf": str(tmp_path / "hf")})
    save_llama(tmp_path / "hf", seed=1)  # other weights, same shape
    with pytest.raises(StageFailed, match="changed after this stage was planned"):
        import_weights(config.from_hf)
    assert Path(config.from_hf.path).is_dir()


def test_special_tokens_and_the_chat_template_survive_import_then_export(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    original = tmp_path / "hf"
    save_llama(original, chat=True)
    config = ModelConfig.model_validate({"from_hf": str(original)})
    checkpoint = read_checkpoint(str(original))
    assert (checkpoint.chat_template, checkpoint.chat_template_file) == (CHATML, "chat_template.jinja")
    (tmp_path / "tokenizer").mkdir()
    copy_tokenizer(config.from_hf, tmp_path / "tokenizer")
    (tmp_path / "out").mkdir()
    weights = import_weights(config.from_hf)
    export_hugging_face(hugging_face_layout(config, weights, 320), weights, tmp_path / "out", tokenizer=tmp_path / "tokenizer" / "tokenizer.json",
                        context=config.context, record={}, chat_template=checkpoint.chat_template)

    def read(directory: Path, name: str) -> dict:
        return json.loads((directory / name).read_text())

    for name in ("config.json", "generation_config.json"):
        before, after = read(original, name), read(tmp_path / "out", name)
        ids = sorted(key for key in before.keys() | after.keys() if key.endswith("_token_id"))
        assert ids == ["bos_token_id", "eos_token_id", "pad_token_id"], name
        assert [after.get(key) for key in ids] == [before[key] for key in ids] == [0, 1, 2], name
    settings = read(tmp_path / "out", "tokenizer_config.json")
    assert settings == {**read(original, "tokenizer_config.json"), "chat_template": CHATML}  # every field, add_bos_token included
    assert settings["add_bos_token"] is False

    theirs, ours = (transformers.AutoTokenizer.from_pretrained(d, local_files_only=True) for d in (original, tmp_path / "out"))
    for field in CHAT_TOKENS:
        assert getattr(ours, field) == getattr(theirs, field) == CHAT_TOKENS[field], field
        assert getattr(ours, f"{field}_id") == getattr(theirs, f"{field}_id"), field
    assert ours.chat_template == theirs.chat_template == CHATML
    turns = [{"role": "user", "content": "def f(x):"}]
    assert ours.apply_chat_template(turns, add_generation_prompt=True) == theirs.apply_chat_template(turns, add_generation_prompt=True)
    assert ours(TEXTS[3])["input_ids"] == theirs(TEXTS[3])["input_ids"]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True)
    assert (loaded.generation_config.bos_token_id, loaded.generation_config.eos_token_id, loaded.generation_config.pad_token_id) == (0, 1, 2)


def test_a_chat_template_in_the_tokenizer_config_is_read_as_older_transformers_wrote_it(tmp_path):
    save_llama(tmp_path / "hf", chat=True)
    (tmp_path / "hf" / "chat_template.jinja").unlink()
    settings = tmp_path / "hf" / "tokenizer_config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "chat_template": [{"name": "tool_use", "template": "{{ 1 }}"},
                                                                                          {"name": "default", "template": CHATML}]}))
    checkpoint = read_checkpoint(str(tmp_path / "hf"))
    assert (checkpoint.chat_template, checkpoint.chat_template_file) == (CHATML, "tokenizer_config.json")
    assert checkpoint.chat_template_source == f"{(tmp_path / 'hf').resolve()}{os.sep}tokenizer_config.json"
