"""`model.from_hf`: a Hugging Face checkpoint directory read into the model's shape, its files (the chat template's
included) in the fingerprints, and every bad directory refused before any compute with the file and the mismatch named;
`factory check` of such a file: its training stages' checkpoints are evaluated, its chat template must render."""

import json
import shutil
from pathlib import Path

import pytest

from factory.config import load_text
from factory.config.stages import plan_stage, stages_of, upstream_of
from factory.config.loader import key_locations
from factory.errors import ConfigError
from factory.preflight import check_files
from tests.models.hf_checkpoints import save_llama, tokenizer

FILE = """---
data:
  datasets:
    code:
      source: {{kind: directory, path: {data}}}
model:
{model}
{sections}
---
"""
SFT = "sft: {steps: 2, batch_size: 2}"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("hf") / "llama"
    save_llama(directory)
    return directory


@pytest.fixture
def roots(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("FACTORY_DATA_ROOTS", str(tmp_path_factory.getbasetemp()))


def experiment(directory: Path, tmp_path: Path, model: str = "", sections: str = SFT):
    (tmp_path / "data").mkdir(exist_ok=True)
    text = FILE.format(data=tmp_path / "data", model=f"  from_hf: {directory}\n{model}".rstrip(), sections=sections)
    [loaded] = load_text(tmp_path / "imported.md", text)
    return loaded


def refusal(directory: Path, tmp_path: Path, model: str = "", sections: str = SFT) -> str:
    with pytest.raises(ConfigError) as caught:
        experiment(directory, tmp_path, model, sections)
    return str(caught.value)


def broken(checkpoint: Path, tmp_path: Path) -> Path:
    """A copy of the checkpoint to damage."""
    copy = tmp_path / "broken"
    shutil.copytree(checkpoint, copy)
    return copy


def edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_the_checkpoint_gives_the_shape_and_its_files_enter_the_fingerprints(checkpoint, tmp_path, roots):
    loaded = experiment(checkpoint, tmp_path, model="  context: 64\n  dropout: 0.1")
    model = loaded.model
    assert (model.arch, model.n_layer, model.n_head, model.n_kv_head, model.n_embd, model.intermediate_size) == ("llama", 2, 4, 2, 64, 160)
    assert (model.rope_theta, model.norm_eps, model.tie_embeddings, model.context, model.dropout) == (5000.0, 1e-6, False, 64, 0.1)
    assert model.from_hf.path == str(checkpoint)
    # sft starts from the checkpoint without a pretrain section; the tokenizer is the checkpoint's, read from nothing else
    assert stages_of(loaded)[-3:] == ("tokenizer", "sft", "model") and upstream_of(loaded, "tokenizer") == ()
    tokenizer_spec = plan_stage(loaded, "tokenizer", {})
    assert tokenizer_spec.config == {"from_hf": {"path": str(checkpoint), "files": model.from_hf.files}}
    sft = plan_stage(loaded, "sft", {"tokenizer": "t", "blend": "b", "filtered_datasets": "f"}).config
    assert sft["model"]["from_hf"] == tokenizer_spec.config["from_hf"]

    changed = broken(checkpoint, tmp_path)
    again = experiment(changed, tmp_path).model.from_hf
    assert again.files == model.from_hf.files  # the same bytes elsewhere: the same digest
    with (changed / "generation_config.json").open("a") as f:
        f.write("\n")
    assert experiment(changed, tmp_path).model.from_hf.files != model.from_hf.files  # any file changed: another digest


def test_a_missing_file_is_named(checkpoint, tmp_path, roots):
    copy = broken(checkpoint, tmp_path)
    (copy / "tokenizer.json").unlink()
    said = refusal(copy, tmp_path)
    assert "imported.md:" in said and "model.from_hf" in said and f"{copy.resolve()} has no tokenizer.json" in said
    (copy / "model.safetensors").unlink()
    shutil.copyfile(checkpoint / "tokenizer.json", copy / "tokenizer.json")
    assert "neither model.safetensors nor model.safetensors.index.json" in refusal(copy, tmp_path)
    assert "found nothing" in refusal(tmp_path / "nowhere", tmp_path)


def test_another_architecture_is_refused(checkpoint, tmp_path, roots):
    copy = broken(checkpoint, tmp_path)
    edit_json(copy / "config.json", architectures=["MistralForCausalLM"], model_type="mistral")
    assert "config.json is a MistralForCausalLM checkpoint; model.from_hf reads LlamaForCausalLM" in refusal(copy, tmp_path)
    edit_json(copy / "config.json", architectures=["LlamaForCausalLM"], model_type="llama", rope_scaling={"rope_type": "llama3"})
    assert "rope_scaling" in refusal(copy, tmp_path)


def test_shapes_that_disagree_with_the_config_name_the_tensor(checkpoint, tmp_path, roots):
    copy = broken(checkpoint, tmp_path)
    edit_json(copy / "config.json", intermediate_size=128)
    said = refusal(copy, tmp_path)
    assert "model.safetensors: model.layers.0.mlp.gate_proj.weight is [160, 64], but" in said and "implies [128, 64]" in said
    edit_json(copy / "config.json", intermediate_size=160, num_hidden_layers=3)
    assert "lack model.layers.2." in refusal(copy, tmp_path)


def test_a_tokenizer_of_another_vocabulary_is_refused(checkpoint, tmp_path, roots):
    copy = broken(checkpoint, tmp_path)
    tokenizer(300).save(str(copy / "tokenizer.json"))
    said = refusal(copy, tmp_path)
    assert "tokenizer.json has 300 tokens but the embedding" in said and "has 320 rows" in said
    shutil.copyfile(checkpoint / "tokenizer.json", copy / "tokenizer.json")
    edit_json(copy / "tokenizer_config.json", eos_token="<|im_end|>")
    assert "names no end-of-text token" in refusal(copy, tmp_path)


def test_the_model_section_keeps_the_checkpoints_shape_and_one_start(checkpoint, tmp_path, roots):
    said = refusal(checkpoint, tmp_path, model="  n_layer: 4")
    assert "imported.md:" in said and "model.n_layer is 4, but" in said and "remove model.n_layer" in said
    assert "lower model.context" in refusal(checkpoint, tmp_path, model="  context: 256")
    assert "keep one of the two" in refusal(checkpoint, tmp_path, sections="sft: {steps: 2, from: alias:production}")
    assert "whose tokenizer it keeps" in refusal(checkpoint, tmp_path, sections=SFT + "\ntokenizer: {vocab_size: 512}")
    continued = experiment(checkpoint, tmp_path, sections="pretrain: {steps: 2, batch_size: 2}")
    assert stages_of(continued)[-3:] == ("tokenizer", "pretrain", "model")


@pytest.mark.parametrize("changes, said", [
    ({"num_attention_heads": 0}, "no positive integer num_attention_heads"),
    ({"rope_parameters": "fast"}, "rope_parameters an object"),
    ({"hidden_size": "64"}, "no positive integer hidden_size"),
])
def test_a_malformed_config_is_refused_not_a_traceback(checkpoint, tmp_path, roots, changes, said):
    copy = broken(checkpoint, tmp_path)
    edit_json(copy / "config.json", **changes)
    assert said in refusal(copy, tmp_path)


def test_a_damaged_safetensors_header_is_refused(checkpoint, tmp_path, roots):
    copy = broken(checkpoint, tmp_path)
    header = b'{"model.norm.weight": {"dtype": "F32"}}'
    (copy / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    assert "its header gives 'model.norm.weight' no shape" in refusal(copy, tmp_path)
    (copy / "model.safetensors").write_bytes(b"\xff" * 16)
    assert "is not a safetensors file" in refusal(copy, tmp_path)


def checked(directory: Path, tmp_path: Path, sections: str, text: str = FILE) -> tuple[Path, list[str]]:
    """`factory check` of a file (`text`) importing `directory`, with `sections`: the file and its errors."""
    (tmp_path / "data").mkdir(exist_ok=True)
    path = tmp_path / "imported.md"
    path.write_text(text.format(data=tmp_path / "data", model=f"  from_hf: {directory}", sections=sections))
    [report] = check_files([path])
    return path, report.errors


def test_eval_is_accepted_where_a_stage_trains_and_refused_where_none_does(checkpoint, tmp_path, roots):
    assert checked(checkpoint, tmp_path, SFT + "\neval: {benchmarks: [val_bpb]}")[1] == []  # its sft checkpoints are evaluated
    assert checked(checkpoint, tmp_path, "pretrain: {steps: 2, batch_size: 2}\neval: {benchmarks: [val_bpb]}")[1] == []
    path, errors = checked(checkpoint, tmp_path, "eval: {benchmarks: [val_bpb]}")
    assert errors == [f"{path}:{key_locations(path)[('eval',)][1]}: eval: no stage of this file trains (a section of pretrain, "
                      "sft, rl), so there are no checkpoints to evaluate; add one or remove eval"]


CHATS = FILE.replace("      source: {{kind: directory, path: {data}}}\n", """      source: {{kind: directory, path: {data}}}
    chat:
      source: {{kind: directory, path: {data}, format: jsonl, columns: [messages]}}
  blend: [{{dataset: code}}]
""")
"""The file with a dataset of chats SFT renders."""
SFT_ON_CHATS = "sft: {steps: 2, batch_size: 2, data: {dataset: chat, format: messages}}"


def test_the_chat_template_is_in_the_digest_and_must_render_where_sft_renders_rows_with_it(tmp_path, roots):
    directory = tmp_path / "chat"
    save_llama(directory, chat=True)
    assert checked(directory, tmp_path, SFT_ON_CHATS, CHATS)[1] == []
    files = experiment(directory, tmp_path).model.from_hf.files
    (directory / "chat_template.jinja").write_text("{{ bos_token }}" + (directory / "chat_template.jinja").read_text())
    assert experiment(directory, tmp_path).model.from_hf.files != files  # a changed template: the stages that read it run again
    path, errors = checked(directory, tmp_path, SFT_ON_CHATS, CHATS)
    line = key_locations(path)[("sft", "data")][1]
    assert errors == [f"{path}:{line}: sft.data: the rows would be rendered with the chat template of {directory.resolve()}/chat_template.jinja, "
                      "but the template does not render a messages conversation of 2 turns (UndefinedError: 'bos_token' is undefined); it gets "
                      "'messages' (a list of {role, content}) and 'add_generation_prompt' and nothing else; set sft.data.chat_template to one "
                      "that renders them"]
    own = SFT_ON_CHATS.replace("format: messages", "format: messages, chat_template: '{{ messages[-1].content }}'")
    assert checked(directory, tmp_path, own, CHATS)[1] == []  # the file's own template: the checkpoint's is not rendered
