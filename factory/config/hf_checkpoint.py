"""A Hugging Face Llama checkpoint on this machine that a model starts from (`model.from_hf`), read and checked before
any compute.

The directory is what `save_pretrained` writes: `config.json` (`LlamaForCausalLM`), the weights as `model.safetensors`
or as shards named by `model.safetensors.index.json`, and the tokenizer as `tokenizer.json` (with `tokenizer_config.json`
naming its end-of-text token, and an instruction-tuned model's chat template in `chat_template.jinja`, where
`transformers` 5 writes it, or in `tokenizer_config.json`, where older versions did). Reading it gives the model's shape,
the digest of its files (which every fingerprint of a stage that reads it holds, so a changed file, the template's
included, makes them run again), the tokenizer's vocabulary, its end-of-text token and the chat template.
Each check reads only headers and json: the shape of every tensor against `config.json`, the embedding's rows against
the tokenizer's vocabulary. A problem is a `ConfigError` naming the file and what to change. Nothing is ever downloaded.
"""

from __future__ import annotations

import functools
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from factory.config.files import outside_roots
from factory.config.settings import data_roots
from factory.config.sources import hashed_files, listing_digest
from factory.errors import ConfigError
from factory.config.sft_data import render_problem, template_problem
from factory.registry.layout import CHAT_TEMPLATE_FILE, MODEL_CONFIG, MODEL_SAFETENSORS, TOKENIZER_CONFIG, TOKENIZER_FILE

ARCHITECTURE = "LlamaForCausalLM"
SAFETENSORS_INDEX = "model.safetensors.index.json"
MAX_JSON_BYTES = 64 << 20
"""The largest json file read (a tokenizer of 250k tokens is about 20 MB)."""
MAX_HEADER_BYTES = 100 << 20
"""The largest safetensors header read (a few MB for the largest models)."""
DERIVED_BUFFERS = ("rotary_emb.inv_freq",)
"""Tensors older checkpoints saved that are derived from the config, not trained: not read."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HFCheckpoint:
    """A checked Hugging Face checkpoint directory."""

    root: Path
    files: dict[str, str]
    """{file name: sha256} of every file in the directory."""
    digest: str
    """The digest of that listing: what fingerprints hold."""
    shape: dict[str, Any]
    """The `model` section it stands for (arch, widths, heads, ...)."""
    vocab_size: int
    eos_token: str
    """The token that ends a document (the tokenizer config's `eos_token`)."""
    chat_template: str | None
    """The chat template of an instruction-tuned model, if it has one."""
    chat_template_file: str | None
    """The file it was read from: `chat_template.jinja`, else `tokenizer_config.json`."""
    tensors: dict[str, str]
    """{Hugging Face tensor name: the file holding it}."""

    @property
    def chat_template_source(self) -> str:
        """Where the chat template was read, as messages name it."""
        return f"{self.root / (self.chat_template_file or TOKENIZER_CONFIG)}"

    def chat_template_problem(self, format: str = "messages") -> str | None:
        """Why the factory cannot render the chat template on a conversation of `format` in its sandbox (a template may use
        what `transformers` gives it beside the messages: `bos_token`, `raise_exception`, ...); None when it can or there
        is none."""
        if self.chat_template is None:
            return None
        return template_problem(self.chat_template) or render_problem(self.chat_template, format)


def read_checkpoint(path: str) -> HFCheckpoint:
    """Read and check the checkpoint directory `path` (relative paths start at the working directory)."""
    root = Path(path).expanduser()
    if refused := outside_roots(root, data_roots()):
        raise ConfigError(f"{refused}; point model.from_hf at a checkpoint directory under them")
    if not root.is_dir():
        found = "a file" if root.is_file() else "nothing"
        raise ConfigError(f"expected a Hugging Face checkpoint directory at {root.resolve()}, found {found}; save one there with "
                          "`save_pretrained` (nothing is downloaded at run time)")
    names = sorted(p.name for p in root.iterdir() if not p.name.startswith(".") and p.is_file())
    files = hashed_files(root, names)
    return _checked(root.resolve(), tuple(sorted(files.items())))


@functools.lru_cache(maxsize=8)
def _checked(root: Path, files: tuple[tuple[str, str], ...]) -> HFCheckpoint:
    """The checks, once per content of a directory (a run reads its experiment many times)."""
    listing = dict(files)
    for name in (MODEL_CONFIG, TOKENIZER_FILE):
        if name not in listing:
            raise ConfigError(f"{root} has no {name}: a Hugging Face checkpoint directory holds {MODEL_CONFIG}, the weights "
                              f"({MODEL_SAFETENSORS} or {SAFETENSORS_INDEX}) and {TOKENIZER_FILE}" +
                              (" (convert a sentencepiece tokenizer.model with `AutoTokenizer.from_pretrained(dir).save_pretrained(dir)`)"
                               if name == TOKENIZER_FILE else ""))
    config = read_json(root / MODEL_CONFIG)
    shape = _shape(root / MODEL_CONFIG, config)
    tensors = _tensor_shapes(root, listing)
    tensors = _same_tensors(root, tensors, expected_shapes(shape, config["vocab_size"]))  # _shape checked vocab_size
    settings = read_json(root / TOKENIZER_CONFIG) if TOKENIZER_CONFIG in listing else {}
    tokenizer_vocab, eos = _tokenizer(root, config, settings)
    chat_template, template_file = _chat_template(root, listing, settings)
    embedding = tensors["model.embed_tokens.weight"][0][0]
    if tokenizer_vocab != embedding:
        raise ConfigError(f"{root / TOKENIZER_FILE} has {tokenizer_vocab:,} tokens but the embedding "
                          f"(model.embed_tokens.weight, {MODEL_CONFIG} vocab_size) has {embedding:,} rows: the tokenizer must be "
                          "the one the model was trained with")
    return HFCheckpoint(root=root, files=listing, digest=listing_digest(listing), shape=shape, vocab_size=embedding, eos_token=eos,
                        chat_template=chat_template, chat_template_file=template_file, tensors={name: file for name, (_, file) in tensors.items()})


def _shape(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The `model` section a Llama `config.json` stands for; another architecture, or an option the factory's llama does not
    compute, is refused."""
    architectures = config.get("architectures") or []
    if config.get("model_type") != "llama" or architectures not in ([ARCHITECTURE], []):
        named = ", ".join(map(str, architectures)) or f"model_type {config.get('model_type')!r}"
        raise ConfigError(f"{path} is a {named} checkpoint; model.from_hf reads {ARCHITECTURE} checkpoints (model_type llama)")
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        if not isinstance(config.get(key), int) or isinstance(config.get(key), bool) or config[key] < 1:
            raise ConfigError(f"{path} has no positive integer {key}: is it a {ARCHITECTURE} config.json?")
    if not isinstance(config.get("num_key_value_heads") or 1, int) or not isinstance(config.get("rope_parameters") or {}, dict):
        raise ConfigError(f"{path}: num_key_value_heads must be an integer and rope_parameters an object")
    width, heads = config["hidden_size"], config["num_attention_heads"]
    refused = [
        f"{key} {config[key]!r} (the factory's llama computes {allowed!r})" for key, allowed in (
            ("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False), ("pretraining_tp", 1),
            ("head_dim", width // heads), ("rope_scaling", None),
        ) if config.get(key, allowed) != allowed
    ]
    rope = config.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        refused.append(f"rope_parameters.rope_type {rope['rope_type']!r} (the factory's llama computes 'default')")
    if refused:
        raise ConfigError(f"{path} asks for {'; '.join(refused)}: a checkpoint that needs these cannot be computed by arch llama")
    theta = rope.get("rope_theta", config.get("rope_theta", 10_000.0))
    return {
        "arch": "llama",
        "n_layer": config["num_hidden_layers"],
        "n_head": heads,
        "n_kv_head": config.get("num_key_value_heads") or heads,
        "n_embd": width,
        "context": config.get("max_position_embeddings", 2048),
        "intermediate_size": config["intermediate_size"],
        "rope_theta": float(theta),
        "norm_eps": float(config.get("rms_norm_eps", 1e-6)),
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
    }


def expected_shapes(shape: dict[str, Any], vocab_size: int) -> dict[str, tuple[int, ...]]:
    """{Hugging Face tensor name: shape} of `LlamaForCausalLM` with this shape (the head left out when tied)."""
    width, head_width = shape["n_embd"], shape["n_embd"] // shape["n_head"]
    kv, mlp = shape["n_kv_head"] * head_width, shape["intermediate_size"]
    expected = {"model.embed_tokens.weight": (vocab_size, width), "model.norm.weight": (width,)}
    for i in range(shape["n_layer"]):
        layer = f"model.layers.{i}."
        expected |= {
            layer + "input_layernorm.weight": (width,), layer + "post_attention_layernorm.weight": (width,),
            layer + "self_attn.q_proj.weight": (width, width), layer + "self_attn.k_proj.weight": (kv, width),
            layer + "self_attn.v_proj.weight": (kv, width), layer + "self_attn.o_proj.weight": (width, width),
            layer + "mlp.gate_proj.weight": (mlp, width), layer + "mlp.up_proj.weight": (mlp, width),
            layer + "mlp.down_proj.weight": (width, mlp),
        }
    if not shape["tie_embeddings"]:
        expected["lm_head.weight"] = (vocab_size, width)
    return expected


def _tensor_shapes(root: Path, listing: dict[str, str]) -> dict[str, tuple[tuple[int, ...], str]]:
    """{tensor name: (shape, file)} from the safetensors headers (one file, or the shards an index names)."""
    if MODEL_SAFETENSORS in listing:
        files = [MODEL_SAFETENSORS]
    elif SAFETENSORS_INDEX in listing:
        weight_map = read_json(root / SAFETENSORS_INDEX).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConfigError(f"{root / SAFETENSORS_INDEX} has no weight_map naming the shard of each tensor")
        files = sorted(set(map(str, weight_map.values())))
        if missing := [f for f in files if f not in listing]:
            raise ConfigError(f"{root / SAFETENSORS_INDEX} names shards the directory lacks: {', '.join(missing[:5])}")
    else:
        other = " (pytorch_model.bin is a pickle the factory does not load: save with safe_serialization=True)" \
            if any(name.startswith("pytorch_model") for name in listing) else ""
        raise ConfigError(f"{root} has neither {MODEL_SAFETENSORS} nor {SAFETENSORS_INDEX}{other}")
    found: dict[str, tuple[tuple[int, ...], str]] = {}
    for file in files:
        for name, shape in _header(root / file).items():
            if not name.endswith(DERIVED_BUFFERS):
                found[name] = (shape, file)
    return found


def _same_tensors(root: Path, found: dict[str, tuple[tuple[int, ...], str]], expected: dict[str, tuple[int, ...]],
                  ) -> dict[str, tuple[tuple[int, ...], str]]:
    """The tensors to read: every one `config.json` implies is there, with its shape, and no other."""
    shown = f"{root / MODEL_CONFIG}"
    if "lm_head.weight" not in expected:  # tied: a copy of the embedding some writers keep anyway is not read
        found = {name: entry for name, entry in found.items() if name != "lm_head.weight"}
    if missing := [name for name in expected if name not in found]:
        raise ConfigError(f"the weights in {root} lack {', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}, which {shown} "
                          "implies: the weights are not of the model the config describes")
    if unexpected := [name for name in found if name not in expected]:
        raise ConfigError(f"{root / found[unexpected[0]][1]} holds {', '.join(unexpected[:3])}, which a {ARCHITECTURE} of {shown} does not have")
    for name, want in expected.items():
        have, file = found[name]
        if tuple(have) != want:
            raise ConfigError(f"{root / file}: {name} is {list(have)}, but {shown} implies {list(want)}: the config and the weights "
                              "disagree (fix config.json or save the checkpoint again)")
    return found


def _tokenizer(root: Path, config: dict[str, Any], settings: dict[str, Any]) -> tuple[int, str]:
    """The tokenizer's vocabulary size (added tokens included) and its end-of-text token (the tokenizer config's
    `eos_token`, else the token of `config.json`'s `eos_token_id`)."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_str((root / TOKENIZER_FILE).read_text())
    except Exception as e:  # the tokenizers library raises its own Exception for every malformed file
        raise ConfigError(f"{root / TOKENIZER_FILE} is not a tokenizer the `tokenizers` library reads: {str(e)[:200]}") from e
    eos = settings.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if eos is None and isinstance(config.get("eos_token_id"), int) and 0 <= config["eos_token_id"] < tokenizer.get_vocab_size():
        eos = tokenizer.id_to_token(config["eos_token_id"])
    if not isinstance(eos, str) or tokenizer.token_to_id(eos) is None:
        raise ConfigError(f"{root / TOKENIZER_CONFIG} names no end-of-text token of {TOKENIZER_FILE} (eos_token is {eos!r}): the "
                          "factory ends every document with it; set eos_token to one of the tokenizer's special tokens")
    return tokenizer.get_vocab_size(with_added_tokens=True), eos


def _chat_template(root: Path, listing: dict[str, str], settings: dict[str, Any]) -> tuple[str | None, str | None]:
    """The chat template and the file holding it: `chat_template.jinja`, else the tokenizer config's `chat_template` (a
    string, or named templates of which the one named `default` is the chat template); (None, None) without one."""
    if CHAT_TEMPLATE_FILE in listing:
        path = root / CHAT_TEMPLATE_FILE
        try:
            if path.stat().st_size > MAX_JSON_BYTES:
                raise ConfigError(f"{path} is over {MAX_JSON_BYTES >> 20} MB: not a chat template")
            return path.read_text(), CHAT_TEMPLATE_FILE
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path} does not read as text: {e}") from e
    template = settings.get("chat_template")
    if isinstance(template, list):
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
    return (template, TOKENIZER_CONFIG) if isinstance(template, str) else (None, None)


def _header(path: Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} from a safetensors file's header (its first 8 bytes give the json header's length)."""
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > MAX_HEADER_BYTES:
                raise ValueError(f"a header of {length:,} bytes")
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error) as e:
        raise ConfigError(f"{path} is not a safetensors file: {e}") from e
    shapes = {}
    for name, entry in header.items() if isinstance(header, dict) else ():
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if name != "__metadata__" and not (isinstance(shape, list) and all(isinstance(n, int) for n in shape)):
            raise ConfigError(f"{path} is not a safetensors file: its header gives {name!r} no shape")
        if name != "__metadata__":
            shapes[name] = tuple(shape)
    return shapes


def read_json(path: Path) -> dict[str, Any]:
    """A json object of the checkpoint (bounded in size); a ConfigError naming the file otherwise."""
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise ConfigError(f"{path} is over {MAX_JSON_BYTES >> 20} MB: not a checkpoint's json")
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} does not read as json: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a json {type(data).__name__}, not an object")
    return data
