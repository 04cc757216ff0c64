"""The names of the files inside artifacts, in one place: what one stage writes and the stages, operator commands and
viewers downstream read.

A name here is part of an artifact's layout: published artifacts are immutable, so a name changes only with a new
layout that readers still accept the old one beside.
"""

SOURCES_FILE = "sources.json"
"""raw_datasets: the listing of the source files it read (path -> sha256), compared by `factory plan` and `reproduce`."""
DATASETS_FILE = "datasets.json"
"""Data stages: the table version each dataset was written as."""
CHECKS_FILE = "checks.json"
"""filtered_datasets: the outcome of each dataset check."""
BLEND_FILE = "blend.json"
"""blend: the mixture, as table versions with weights and modes."""
TOKENIZER_FILE = "tokenizer.json"
"""tokenizer (and the exported model): the tokenizer, as the `tokenizers` library writes it."""
CHAT_TEMPLATE_FILE = "chat_template.jinja"
"""Training stages (and the model exported from them): the chat template the model was fine-tuned with, or the one the
checkpoint `model.from_hf` names carries; where `transformers` 5 writes a tokenizer's chat template."""
TOKEN_IDS_FILE = "token_ids.json"
"""tokenizer of a checkpoint `model.from_hf` names: the special token ids its `config.json` and `generation_config.json`
give, by file, which the exported model's files give again."""
RUN_FILE = "run.json"
"""Training stages: how the run ended (steps, tokens, the kept checkpoints, the tracker run)."""
METRICS_FILE = "metrics.jsonl"
"""Training stages: one line of metrics per logged step."""
POSITIONS_FILE = "data_positions.jsonl"
"""Training stages: where each step's batch came from in the blend."""
CONTROL_FILE = "control.jsonl"
"""Training stages: each control rule's decisions and alerts."""
MODEL_CONFIG = "config.json"
"""model: the exported model's config (architecture, shape, the stage it came from); with a Hugging Face layout, also
the fields `transformers` reads."""
MODEL_WEIGHTS = "model.pt"
"""model: the exported weights, as a torch state dict (the factory's names)."""
MODEL_SAFETENSORS = "model.safetensors"
"""model: the same weights as safetensors: by Hugging Face names when the model has a Hugging Face layout, else the
factory's names."""
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
"""model, with a Hugging Face layout: the tokenizer's special tokens (and chat template), and generation defaults."""
RESULT_FILE = "result.json"
"""evaluations: one checkpoint's score on one benchmark, with its details."""
BATCH_FILE = "batch.json"
"""evaluation: each pair of the batch, its score and the digest of its result."""
BOARD_FILE = "leaderboard.json"
MARKDOWN_FILE = "leaderboard.md"
HTML_FILE = "leaderboard.html"
"""leaderboard: the board as data, as Markdown and as a page."""
BEST_FILE = "best.json"
"""best_model: the leaderboard row marked best (an experiment's exported model)."""
REPORT_FILE = "report.html"
"""report: the run report page."""
