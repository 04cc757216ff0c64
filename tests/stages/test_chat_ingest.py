"""JSONL and Parquet records ingested through the data stages with the columns their source keeps, and SFT on the
filtered version of such a dataset (`sft.data.dataset`)."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from factory.config import load_file, plan_stage
from factory.config.data_sections import DataConfig, DatasetConfig, SourceConfig
from factory.config.stages import stages_of, upstream_of
from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.tables import parse_ref, read_version, resolve
from factory.models.tokenizer import EOS, load_tokenizer
from factory.post.chat import chat_examples, read_rows
from factory.preflight import check_files
from factory.registry.layout import BLEND_FILE, CHECKS_FILE, DATASETS_FILE, TOKENIZER_FILE
from tests.stages.test_sft_data import CHATS, PAIRS, line_of, run_all, trained_text
from tests.stages.test_sft_data import recipe as sft_recipe

pytestmark = pytest.mark.usefixtures("no_pipes")
DATA_STAGES = ("raw_datasets", "deduped_datasets", "filtered_datasets")
CHAT_DATASET = """    chat:
      source: {{kind: directory, path: {rows}, include: ["*.{format}"], format: {format}, columns: {columns}}}
"""


def chat_lines() -> list[str]:
    """The chats as JSONL, with a duplicate of the first, a record without `messages` and one whose `messages` is text."""
    lines = [json.dumps({"messages": chat, "topic": "sums"}) for chat in CHATS]
    return [*lines, lines[0], json.dumps({"conversation": CHATS[0]}), json.dumps({"messages": "not turns"})]


def write_rows(root: Path, format: str) -> None:
    """The rows of the chat dataset: JSONL chats, or Parquet prompt/completion pairs (with a duplicate, a row whose
    completion is null, and a file without a completion column)."""
    root.mkdir(parents=True)
    if format == "jsonl":
        (root / "chats.jsonl").write_text("\n".join(chat_lines()) + "\n")
        return
    prompts, completions = [p for p, _ in PAIRS], [c for _, c in PAIRS]
    pq.write_table(pa.table({"prompt": [*prompts, prompts[0], "x"], "completion": [*completions, completions[0], None],
                             "n": list(range(len(PAIRS) + 2))}), root / "pairs.parquet")
    pq.write_table(pa.table({"prompt": ["only a prompt"]}), root / "prompts.parquet")


def recipe(tmp_path: Path, format: str = "jsonl", dataset: str = "chat", columns: str | None = None) -> Path:
    """The SFT data tests' experiment (it pretrains briefly on a few modules, the `code` dataset), with a `chat` dataset
    of ingested rows that SFT fine-tunes on."""
    sft_format = "messages" if format == "jsonl" else "prompt_completion"
    path = sft_recipe(tmp_path, f"dataset: {dataset}\nformat: {sft_format}")
    write_rows(tmp_path / "rows", format)
    kept = columns or ("[messages]" if format == "jsonl" else "[prompt, completion]")
    chat = CHAT_DATASET.format(rows=tmp_path / "rows", format=format, columns=kept)
    text = path.read_text()
    path.write_text(text.replace("  blend:\n", chat + "  blend:\n", 1))
    return path


def run_data_stages(tmp_path: Path, path: Path) -> dict[str, Path]:
    """Run the three data stages of the file's experiment through the stage process; each one's artifact directory."""
    return run_all(tmp_path, path, only=DATA_STAGES)


def written(tmp_path: Path, artifact: Path, name: str = "chat") -> tuple[dict, pa.Table]:
    """The `datasets.json` record of a dataset in a data stage's artifact, and the version it names, whole."""
    record = json.loads((artifact / DATASETS_FILE).read_text())[name]
    catalog = open_catalog(CatalogConfig.local(tmp_path / "catalog"))
    snapshot = resolve(catalog, record["table"], record["content_tag"])
    columns = tuple(f.name for f in catalog.load_table(record["table"]).schema().fields)
    return record, read_version(catalog, record["table"], snapshot, columns)


def test_jsonl_chats_become_raw_dedup_and_filtered_tables_with_their_messages(tmp_path):
    artifacts = run_data_stages(tmp_path, recipe(tmp_path))
    raw, raw_rows = written(tmp_path, artifacts["raw_datasets"])
    assert raw["table"] == "raw.chat" and raw["rows"] == 11  # ten chats and the duplicate
    assert (raw["skipped_missing_column"], raw["skipped_wrong_type"]) == (1, 1)
    dedup, _ = written(tmp_path, artifacts["deduped_datasets"])
    assert (dedup["rows_in"], dedup["exact_removed"], dedup["rows_out"]) == (11, 1, 10)
    filtered, rows = written(tmp_path, artifacts["filtered_datasets"])
    assert filtered["table"] == "filtered.chat" and filtered["tag"] == "v1"
    assert rows.column_names == [*raw_rows.column_names] and rows.column_names[-1] == "messages"
    chats = sorted((json.loads(m) for m in rows["messages"].to_pylist()), key=lambda chat: int(chat[1]["content"].split()[2]))
    assert chats == CHATS
    by_path = {r["path"]: r for r in rows.to_pylist()}
    [first] = [by_path[p] for p in ("chats.jsonl:1", "chats.jsonl:11") if p in by_path]  # one of the two equal lines
    assert first["text"] == "\n".join(turn["content"] for turn in CHATS[0])  # what dedup and the filters read
    assert json.loads(first["metadata"]) == {"topic": "sums"}
    checks = {c["name"]: c for c in json.loads((artifacts["filtered_datasets"] / CHECKS_FILE).read_text())}
    assert all(c["passed"] for c in checks.values()), checks
    assert "kept columns messages" in checks["schema"]["description"]


def test_parquet_pairs_become_tables_with_prompt_and_completion_columns(tmp_path):
    artifacts = run_data_stages(tmp_path, recipe(tmp_path, format="parquet"))
    raw, _ = written(tmp_path, artifacts["raw_datasets"])
    assert raw["rows"] == 11 and raw["files_read"] == 2
    assert (raw["skipped_missing_column"], raw["skipped_wrong_type"]) == (1, 1)  # the prompt-only file's row; the null completion
    dedup, _ = written(tmp_path, artifacts["deduped_datasets"])
    assert dedup["exact_removed"] == 1
    _, rows = written(tmp_path, artifacts["filtered_datasets"])
    assert sorted(zip(rows["prompt"].to_pylist(), rows["completion"].to_pylist(), strict=True)) == sorted(PAIRS)
    assert all(r["text"] == r["prompt"] + r["completion"] for r in rows.to_pylist())
    assert {json.loads(m)["n"] for m in rows["metadata"].to_pylist()} == set(range(len(PAIRS)))


def test_sft_trains_on_an_ingested_jsonl_dataset_that_the_blend_leaves_out(tmp_path):
    path = recipe(tmp_path)
    [experiment] = load_file(path)
    assert [part.dataset for part in experiment.data.blend] == ["code"]  # the default blend: no dataset that keeps columns
    assert "filtered_datasets" in upstream_of(experiment, "sft")
    artifacts = run_all(tmp_path, path)
    assert json.loads((artifacts["sft"] / "run.json").read_text())["steps"] == 3
    assert [part["label"] for part in json.loads((artifacts["blend"] / BLEND_FILE).read_text())["parts"]] == ["code"]

    record = json.loads((artifacts["filtered_datasets"] / DATASETS_FILE).read_text())["chat"]
    catalog = open_catalog(CatalogConfig.local(tmp_path / "catalog"))
    snapshot, rows = read_rows(catalog, experiment.sft.data, f"{record['table']}@{record['content_tag']}")
    assert snapshot == resolve(catalog, *parse_ref("filtered.chat@v1")) and len(rows) == 10
    tokenizer = load_tokenizer(artifacts["tokenizer"] / TOKENIZER_FILE)
    examples = chat_examples(rows, experiment.sft.data, tokenizer, tokenizer.token_to_id(EOS), context=64)
    assert sorted(trained_text(examples, tokenizer)) == sorted([[f"{2 * i}\n<eos>", f"{4 * i}\n<eos>"] for i in range(10)])


def test_the_default_blend_leaves_out_datasets_that_keep_columns():
    rows = DatasetConfig(source=SourceConfig(kind="directory", path=".", format="jsonl", columns=("messages",)))
    assert [part.dataset for part in DataConfig(datasets={"code": DatasetConfig(), "chat": rows}).blend] == ["code"]
    assert DataConfig(datasets={"chat": rows}).blend == ()  # refused by the experiment unless it starts from a base model


def test_a_recipe_whose_sft_reads_no_dataset_runs_no_data_stage_for_the_chat_dataset(tmp_path):
    path = recipe(tmp_path)
    path.write_text(path.read_text().replace("    dataset: chat\n", "    table: sft.chat@v1\n"))
    [experiment] = load_file(path)
    assert "filtered_datasets" not in upstream_of(experiment, "sft")
    assert "chat" not in plan_stage(experiment, "raw_datasets", {}).config["sources"]
    assert "raw_datasets" in stages_of(experiment)


def test_check_refuses_an_sft_dataset_the_file_does_not_define_with_its_line(tmp_path):
    path = recipe(tmp_path, dataset="chats")
    [report] = check_files([path])
    assert report.errors == [f"{path}:{line_of(path, 'dataset: chats')}: sft.data.dataset: names no dataset of this file ('chats'; "
                             "its datasets: stdlib, site_packages, code, chat); define it under data.datasets"]


def test_check_refuses_mapped_columns_the_dataset_does_not_keep_with_its_line(tmp_path):
    path = recipe(tmp_path, format="parquet", columns="[prompt]")
    [report] = check_files([path])
    assert report.errors == [f"{path}:{line_of(path, 'dataset: chat')}: sft.data.dataset: dataset 'chat' keeps no column "
                             "'completion' (its source.columns: prompt); add them to data.datasets.chat.source.columns"]
