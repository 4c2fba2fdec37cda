# QPR — the two commands a fresh clone needs are `make run` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(CURDIR)/$(VENV)/bin
# The venv is rebuilt whenever the lock or the project metadata changes.
STAMP  := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml | sha1sum | cut -c1-12)
export PATH := $(BIN):$(PATH)

.PHONY: help install install-gpu data run repro metrics test test-fast lint format lock clean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(STAMP): requirements.lock pyproject.toml
	@test -n "$(PYTHON)" || { echo "Python 3.11 not found (set PYTHON=...)"; exit 1; }
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	$(BIN)/python -m pip check
	touch $@

install: $(STAMP) ## Create .venv with the locked dependencies (CPU)

install-gpu: $(STAMP) ## Swap in FAISS for CUDA (needs a CUDA machine; see README "GPU")
	$(BIN)/python -m pip uninstall --yes faiss-cpu
	$(BIN)/python -m pip install --quiet 'faiss-gpu==1.15.1'

data: install ## Make data/ match data.dvc (regenerates the embedded logs offline)
	$(BIN)/qpr data ensure

run: data ## Set up, run the whole pipeline (dvc repro) and print the metrics
	$(BIN)/dvc repro
	$(BIN)/qpr metrics

repro: install ## dvc repro only
	$(BIN)/dvc repro

metrics: install ## Print the metrics of the last run
	$(BIN)/qpr metrics

test: install ## Every test except those needing a GPU
	$(BIN)/python -m pytest -m "not gpu" -q

test-fast: install ## Unit and data tests only
	$(BIN)/python -m pytest -m "not gpu and not slow" -q tests/unit tests/data

lint: install ## ruff
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

lock: ## Re-pin requirements.lock from the current .venv (after changing pyproject deps)
	$(BIN)/python -m pip freeze --exclude-editable | sed -E 's/^(torch==[0-9.]+)\+cpu$$/\1/' > requirements.lock

clean: ## Remove stage outputs and local tracking state (keeps data/ and the venv)
	rm -rf artifacts metrics plots reports mlruns mlflow.db .prefect models/*.onnx
