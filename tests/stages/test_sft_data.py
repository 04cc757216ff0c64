"""SFT on any table version (`sft.data`): trained through the stage process, checked by `factory check`, exported with
its chat template; a recipe without `data` keeps its fingerprint."""

import inspect
import json
import logging
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from factory.config import UPSTREAM, load_file, plan_stage
from factory.config.schema import ModelConfig, SFTConfig, TokenizerConfig
from factory.config.stages import stage_config, stages_of
from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.loader import PAD
from factory.data.tables import write_version
from factory.models.build import new_model
from factory.models.tokenizer import EOS, load_tokenizer, train_tokenizer
from factory.errors import ConfigError
from factory.post.chat import chat_examples, compile_template, read_rows
from factory.post.sft import sft_batches
from factory.preflight import check_files
from factory.registry.layout import CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG, TOKENIZER_FILE
from factory.registry.store import ArtifactStore, Provenance
from factory.runtime.__main__ import main
from factory.runtime.request import StageRequest
from factory.train.pretrain import load_weights

pytestmark = pytest.mark.usefixtures("no_pipes")
REPO = Path(__file__).resolve().parents[2]
SOURCES = {f"{module.__name__}.py": inspect.getsource(module) for module in (json.encoder, json.decoder, textwrap)}
PAIRS = [(f"def f(x):\n    return x + {i}\nassert f({i}) ==", f" {2 * i}\n") for i in range(10)]
CHATS = [
    [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": f"What is {i} + {i}?"},
     {"role": "assistant", "content": str(2 * i)}, {"role": "user", "content": "And doubled?"},
     {"role": "assistant", "content": str(4 * i)}]
    for i in range(10)
]
RECIPE = """---
extends: {tiny}
data:
  datasets:
    code:
      source: {{kind: directory, path: {source}}}
  blend:
    - {{dataset: code}}
tokenizer: {{vocab_size: 300, sample_bytes: 200000}}
model: {{{model}}}
pretrain: {{steps: 2, batch_size: 2, warmup_steps: 0, log_every: 1}}
eval: null
sft:
  steps: 3
  batch_size: 4
  log_every: 1
  data:
{data}
---
"""


def write_tables(catalog_root: Path) -> None:
    """`sft.pairs@v1` (prompt/completion columns, a split) and `sft.chat@v1` (a messages column of records)."""
    catalog = open_catalog(CatalogConfig.local(catalog_root))
    log = logging.getLogger("test")
    ids = [f"r{i:02d}" for i in range(10)]
    pairs = pa.table({"id": ids, "sha256": ["0" * 64] * 10, "bytes": [1] * 10, "question": [p for p, _ in PAIRS],
                      "answer": [c for _, c in PAIRS], "part": ["train"] * 8 + ["test"] * 2})
    write_version(catalog, "sft.pairs", pairs, log, tag="v1", schema=pairs.schema)
    chats = pa.table({"id": ids, "sha256": ["0" * 64] * 10, "bytes": [1] * 10, "messages": CHATS})
    write_version(catalog, "sft.chat", chats, log, tag="v1", schema=chats.schema)


GPT = "n_layer: 1, n_head: 2, n_embd: 32, context: 64"
LLAMA = "arch: llama, n_layer: 1, n_head: 4, n_kv_head: 2, n_embd: 32, context: 64"


def recipe(tmp_path: Path, data: str, model: str = GPT) -> Path:
    """An experiment file that extends the tiny one, pretrains briefly on a few modules and fine-tunes with `data` (YAML
    lines of the `sft.data` block)."""
    source = tmp_path / "src"
    for name, text in SOURCES.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(text)
    path = tmp_path / "mine.md"
    path.write_text(RECIPE.format(tiny=REPO / "experiments" / "tiny-code-lm.md", source=source, data=textwrap.indent(data, "    "),
                                  model=model))
    return path


def run_all(tmp_path: Path, path: Path, only: tuple[str, ...] | None = None) -> dict[str, Path]:
    """Run every stage of the file's experiment (or the first ones, `only`) in order through the stage process; each
    stage's artifact directory."""
    [experiment] = load_file(path)
    registry = ArtifactStore(tmp_path / "registry")
    digests: dict[str, str] = {}
    for kind in [k for k in UPSTREAM if k in stages_of(experiment) and (only is None or k in only)]:
        spec = plan_stage(experiment, kind, digests)
        request = StageRequest(spec=spec, registry=str(registry.root), catalog=CatalogConfig.local(tmp_path / "catalog"),
                               provenance=Provenance(experiment=experiment.name, config_hash="0" * 16, git_commit="test"))
        assert main([str(request.write(tmp_path / f"{kind}.json"))]) == 0, kind
        digests[kind] = registry.lookup(spec.fingerprint).digest
    return {kind: registry.path(digest) for kind, digest in digests.items()}


def trained_text(examples, tokenizer) -> list[list[str]]:
    """For each example, the text of each run of the tokens its batch's targets count (EOS written as `<eos>`)."""
    eos = tokenizer.token_to_id(EOS)
    batch = next(sft_batches(examples, batch_size=len(examples), seed=0, eos_id=eos))
    found = []
    for row in batch.y.tolist():
        runs = [[]]
        for target in row:
            if target == PAD and runs[-1]:
                runs.append([])
            elif target != PAD:
                runs[-1].append("<eos>" if target == eos else tokenizer.decode([target]))
        found.append(["".join(run) for run in runs if run])
    return found


@pytest.mark.parametrize("data, wanted, model", [
    ("table: sft.pairs@v1\nprompt: question\ncompletion: answer\nsplit: part\nsplit_value: train", "pairs", GPT),
    ("table: sft.chat@v1\nformat: messages", "chat", LLAMA),
])
def test_sft_trains_on_a_table_through_the_mapping_with_the_loss_on_completions_only(tmp_path, data, wanted, model):
    write_tables(tmp_path / "catalog")
    artifacts = run_all(tmp_path, recipe(tmp_path, data, model))
    manifest = json.loads((artifacts["sft"] / "run.json").read_text())
    assert manifest["steps"] == 3
    [experiment] = load_file(tmp_path / "mine.md")
    config = experiment.sft.data
    assert (artifacts["sft"] / CHAT_TEMPLATE_FILE).read_text() == config.template
    assert (artifacts["model"] / CHAT_TEMPLATE_FILE).read_text() == config.template  # exported with the model
    assert json.loads((artifacts["model"] / TOKENIZER_CONFIG).read_text())["chat_template"] == config.template  # for transformers

    tokenizer = load_tokenizer(artifacts["tokenizer"] / TOKENIZER_FILE)
    _, rows = read_rows(open_catalog(CatalogConfig.local(tmp_path / "catalog")), config)
    examples = chat_examples(rows, config, tokenizer, tokenizer.token_to_id(EOS), context=64)
    if wanted == "pairs":
        assert len(rows) == 8  # the train split only
        assert sorted(trained_text(examples, tokenizer)) == sorted([[c + "<eos>"] for _, c in PAIRS[:8]])
    else:
        assert sorted(trained_text(examples, tokenizer)) == sorted([[f"{2 * i}\n<eos>", f"{4 * i}\n<eos>"] for i in range(10)])
        exported_for_transformers(artifacts["model"], config.template)


def exported_for_transformers(model_dir: Path, template: str) -> None:
    """The model stage's directory as `transformers` loads it: the factory's logits, the template it was fine-tuned with."""
    transformers = pytest.importorskip("transformers")
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_key_value_heads"] == 2 and config["steps"] == 3
    loaded = transformers.AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
    ours = new_model(ModelConfig.model_validate(config["model"]), config["vocab_size"])
    ours.load_state_dict(load_weights(model_dir / "model.pt"))
    tokens = torch.randint(0, config["vocab_size"], (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (ours.eval()(tokens) - loaded(tokens).logits).abs().max().item() <= 1e-5
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    turns = CHATS[0][:3]
    rendered = compile_template(template)(messages=turns, add_generation_prompt=True)
    assert tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True) == rendered


def test_a_recipe_without_data_keeps_its_fingerprint():
    """Without `data` the sft stage's config (what its fingerprint hashes) holds exactly the keys it held before `data`
    existed, so registries made then stay valid; with it, the table is part of the fingerprint."""
    [experiment] = load_file(REPO / "experiments" / "tiny-post-train.md")
    left_out = {"data", "from_", *SFTConfig.DEFAULT_LEFT_OUT}  # `from` is an input, `base`; parallelism and the like while default
    assert set(stage_config(experiment, "sft")["sft"]) == set(SFTConfig.model_fields) - left_out
    assert "data" not in stage_config(experiment, "sft")["sft"]
    with_data = experiment.model_copy(update={"sft": experiment.sft.model_validate({**experiment.sft.model_dump(), "data": {"table": "sft.chat@v1"}})})
    assert stage_config(with_data, "sft")["sft"]["data"]["table"] == "sft.chat@v1"


def checked(tmp_path: Path, data: str) -> tuple[Path, list[str]]:
    """`factory check`'s errors for a file fine-tuning with `data`, against the catalog with the two tables."""
    write_tables(tmp_path / "catalog")
    path = recipe(tmp_path, data)
    [report] = check_files([path], catalog=lambda: open_catalog(CatalogConfig.local(tmp_path / "catalog")))
    return path, report.errors


def line_of(path: Path, text: str) -> int:
    """The line of the file that holds `text`."""
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_check_refuses_a_missing_table_version_with_its_line(tmp_path):
    path, errors = checked(tmp_path, "table: sft.chat@v9\nformat: messages")
    assert errors == [f"{path}:{line_of(path, 'sft.chat@v9')}: sft.data.table: Iceberg table sft.chat has no version tagged 'v9'; its tags: v1"]


def test_check_refuses_a_missing_mapped_column_with_its_line(tmp_path):
    path, errors = checked(tmp_path, "table: sft.pairs@v1\nprompt: question")
    assert len(errors) == 1
    assert errors[0].startswith(f"{path}:{line_of(path, 'sft.pairs@v1')}: sft.data.table: sft.pairs@v1 has no column 'completion' (it has ")
    assert "question, answer, part" in errors[0]


def test_check_refuses_a_template_that_does_not_parse_with_its_line(tmp_path):
    path, errors = checked(tmp_path, "table: sft.chat@v1\nformat: messages\nchat_template: '{% for m in messages %}{{ m.content }'")
    assert len(errors) == 1
    assert errors[0].startswith(f"{path}:{line_of(path, 'chat_template')}: sft.data.chat_template: the template does not parse: "
                                "line 1 of the template: unexpected '}'")


def test_check_refuses_a_template_that_renders_no_conversation_with_its_line(tmp_path):
    path, errors = checked(tmp_path, "table: sft.chat@v1\nformat: messages\nchat_template: '{{ messages[0].nothing }}'")
    assert len(errors) == 1 and errors[0].startswith(f"{path}:{line_of(path, 'chat_template')}: sft.data.chat_template: the template "
                                                     "does not render a messages conversation of 2 turns (UndefinedError: "), errors


def test_a_template_that_fails_on_a_row_names_the_row(tmp_path):
    write_tables(tmp_path / "catalog")
    template = "{% for m in messages %}{% if 'What' in m.content %}{{ nothing }}{% endif %}{{ m.content }}{% endfor %}"
    [experiment] = load_file(recipe(tmp_path, f"table: sft.chat@v1\nformat: messages\nchat_template: \"{template}\""))
    config = experiment.sft.data
    _, rows = read_rows(open_catalog(CatalogConfig.local(tmp_path / "catalog")), config)
    tokenizer = train_tokenizer(["hello world"] * 10, TokenizerConfig(vocab_size=300))
    with pytest.raises(ConfigError, match=r"chat_template does not render row 0 of sft.chat@v1: UndefinedError: .*'nothing'"):
        chat_examples(rows, config, tokenizer, 0, context=64)
