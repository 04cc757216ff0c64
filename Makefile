# Every target installs what it needs into .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)
EXPERIMENT ?= experiments/tiny-code-lm.md

.PHONY: setup run ui test check bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing into $(VENV) (first time: about a minute)"
	@$(BIN)/python -m pip install --disable-pip-version-check -e '.[dev]' > $(VENV)/install.log 2>&1 \
		|| { grep -v "is ignored: it is neither" $(VENV)/install.log | tail -40; echo "pip install failed: see $(VENV)/install.log"; exit 1; }
	@$(BIN)/python -c "import factory, assets, resources, torch, dagster, pyiceberg"
	@rm -f $(VENV)/.installed-* && touch $@

run: setup
	$(BIN)/factory run $(EXPERIMENT)

ui: setup
	$(BIN)/factory ui

check: setup
	$(BIN)/factory check experiments

test: setup
	$(BIN)/lint-imports
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/python bench/check_configs.py
	$(BIN)/python bench/stage_cache.py
	$(BIN)/python bench/loader.py
	$(BIN)/python bench/trainer.py

clean:
	chmod -R u+w .factory 2>/dev/null || true
	rm -rf .factory
