"""Hugging Face export checked against the real client: `transformers` loads the exported directory, offline, and gives
the factory's logits (fp32, within 1e-5), its greedy continuations and its token ids."""

import inspect
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from factory.config.schema import ModelConfig, TokenizerConfig
from factory.models.build import build_model, hugging_face_layout
from factory.models.generate import generate
from factory.models.hf_export import export_hugging_face
from factory.models.hf_layout import NO_LAYOUT_ROTARY_GPT, HFLayout
from factory.models.sampling import Sampling
from factory.models.tokenizer import load_tokenizer, train_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never a download: everything is built here
transformers = pytest.importorskip("transformers")

VOCAB = 400
CONTEXT = 64
TOLERANCE = 1e-5
MODELS = {
    "llama-gqa-untied": ModelConfig(arch="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=64, context=CONTEXT,
                                    tie_embeddings=False, rope_theta=500.0, norm_eps=1e-6, intermediate_size=96),
    "llama-tied": ModelConfig(arch="llama", n_layer=2, n_head=4, n_kv_head=1, n_embd=64, context=CONTEXT),
    "gpt-learned": ModelConfig(n_layer=2, n_head=4, n_embd=64, context=CONTEXT),
    "gpt-learned-untied": ModelConfig(n_layer=1, n_head=2, n_embd=32, context=CONTEXT, tie_embeddings=False),
}
TRAINING_MODULES = ("json.encoder", "json.decoder", "textwrap")
HELD_OUT_MODULES = ("email.message", "csv", "argparse")


def source(module: str) -> str:
    __import__(module)
    return inspect.getsource(sys.modules[module])


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    train_tokenizer([source(m) for m in TRAINING_MODULES], TokenizerConfig(vocab_size=VOCAB, min_frequency=1)).save(str(path))
    return path


@pytest.fixture(scope="module")
def documents() -> list[str]:
    """200 held-out documents: slices of source the tokenizer never saw, and text beyond ASCII."""
    text = "".join(source(m) for m in HELD_OUT_MODULES)
    docs = [text[start : start + 300 + start % 500] for start in range(0, 190 * 997, 997)]
    docs += ["def grüße(名前: str) -> str:\n    return f'¡hola {名前}! 🐍 λx → x²'\n", "", " ", "\n\n\t  x", "<|endoftext|>a<|endoftext|>",
             "x = 'ÿ\\x00'\r\n", "    " * 20, "ünïcödé" * 9, "0123456789" * 7, "\u200b\ufeffzero width"]
    assert len(docs) == 200 and all(len(d) < 1000 for d in docs)
    return docs


def trained_like(config: ModelConfig, seed: int) -> torch.nn.Module:
    """A model whose weights are far from their initialisation (norm gains and biases included), so a tensor mapped to
    the wrong place changes the logits, and a greedy choice is rarely a near tie."""
    model = build_model(config, VOCAB, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.3 * torch.randn(param.shape, generator=generator))
    return model.eval()


@pytest.fixture(scope="module", params=sorted(MODELS))
def exported(request, tmp_path_factory, tokenizer_path):
    config = MODELS[request.param]
    model = trained_like(config, seed=len(request.param))
    layout = hugging_face_layout(config, model.state_dict(), VOCAB)
    assert isinstance(layout, HFLayout)
    directory = tmp_path_factory.mktemp(request.param)
    record = {"model": config.model_dump(mode="json"), "vocab_size": VOCAB, "steps": 7}
    export_hugging_face(layout, model.state_dict(), directory, tokenizer=tokenizer_path, context=CONTEXT, record=record)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=torch.float32).eval()
    return request.param, model, directory, loaded


def test_transformers_gives_the_factory_logits_in_fp32(exported):
    name, model, _, loaded = exported
    tokens = torch.randint(0, VOCAB, (3, CONTEXT), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(tokens), loaded(tokens).logits
    difference = (ours - theirs).abs().max().item()
    print(f"{name}: max |logit difference| {difference:.3g}")
    assert ours.shape == theirs.shape and difference <= TOLERANCE


def test_greedy_continuations_are_the_same_tokens(exported, tokenizer_path, documents):
    _, model, _, loaded = exported
    tokenizer = load_tokenizer(tokenizer_path)
    prompts = [tokenizer.encode(doc).ids[: 4 + 2 * i] for i, doc in enumerate(documents[:8])]
    for prompt in prompts:
        ids = torch.tensor([prompt])
        ours = [list(generate(model, [prompt], Sampling(new_tokens=32), context=CONTEXT)[0].tokens)]
        theirs = loaded.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=None, attention_mask=torch.ones_like(ids))
        assert ours == theirs[:, ids.size(1) :].tolist()


def test_the_files_transformers_reads_name_the_architecture_and_tokens(exported):
    name, model, directory, loaded = exported
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == [type(loaded).__name__] == [("LlamaForCausalLM" if "llama" in name else "GPT2LMHeadModel")]
    assert config["eos_token_id"] == config["bos_token_id"] == 0 and config["torch_dtype"] == "float32"
    assert config["model"] == MODELS[name].model_dump(mode="json") and config["steps"] == 7  # the factory's record, kept
    with safe_open(directory / "model.safetensors", "pt") as stored:
        names = set(stored.keys())
    assert ("lm_head.weight" in names) is (not MODELS[name].tie_embeddings)
    assert names == {n for n, _ in loaded.named_parameters(remove_duplicate=True)}  # every parameter, nothing else
    assert json.loads((directory / "generation_config.json").read_text())["eos_token_id"] == 0
    assert torch.load(directory / "model.pt", weights_only=True).keys() == model.state_dict().keys()  # the factory's own


def test_auto_tokenizer_gives_the_factory_token_ids(exported, tokenizer_path, documents):
    _, _, directory, _ = exported
    ours = load_tokenizer(tokenizer_path)
    theirs = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    for document in documents:
        ids = ours.encode(document).ids
        assert theirs(document)["input_ids"] == ids, document
        assert theirs.decode(ids, skip_special_tokens=True) == ours.decode(ids)
    assert theirs.eos_token_id == ours.token_to_id("<|endoftext|>")


def test_a_chat_template_travels_in_the_tokenizer_config(tmp_path, tokenizer_path):
    config = MODELS["llama-tied"]
    weights = build_model(config, VOCAB, seed=0).state_dict()
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
    export_hugging_face(hugging_face_layout(config, weights, VOCAB), weights, tmp_path, tokenizer=tokenizer_path, context=CONTEXT,
                        record={}, chat_template=template)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "user: hi\nassistant:"


def test_the_same_weights_export_the_same_bytes(tmp_path, tokenizer_path):
    config = MODELS["llama-gqa-untied"]
    weights = build_model(config, VOCAB, seed=3).state_dict()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        export_hugging_face(hugging_face_layout(config, weights, VOCAB), weights, tmp_path / name, tokenizer=tokenizer_path,
                            context=CONTEXT, record={"steps": 1})
    for file in sorted(p.name for p in (tmp_path / "a").iterdir()):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes(), file


def test_a_gpt_with_rotary_positions_says_which_architectures_export():
    config = ModelConfig(n_layer=1, n_head=2, n_embd=32, context=16, positions="rotary")
    layout = hugging_face_layout(config, build_model(config, VOCAB, seed=0).state_dict(), VOCAB)
    assert layout == NO_LAYOUT_ROTARY_GPT and "LlamaForCausalLM" in layout and "GPT2LMHeadModel" in layout
