# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# The CPU wheel of torch 2.13.0 (a GPU runner sets TORCH_SPEC to its CUDA build).
TORCH_SPEC ?= torch==2.13.0
# The example `make demo` runs end to end (with its baseline): a learning-rate hypothesis on
# eval/loss over 3 paired seeds of a 60-step run, decided (refuted) within about 4 minutes on
# 2 cores; the downstream task's accuracy (docs/downstream.md) is reported beside it.
EXPERIMENT ?= next-line-lr
TEST_WORKERS ?= 2
JUNIT ?= .pytest-junit.xml
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := true
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup setup-github setup-train demo test test-fast test-budget lint bench gpu-check-prepare gpu-check clean

setup: $(STAMP)

# torch first (the CPU wheel that satisfies the range), then the project; the stamp
# makes a second `make setup` a no-op unless pyproject.toml changed.
$(STAMP): pyproject.toml constraints/constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -c constraints/constraints.txt -e ".[dev]"
	touch $(STAMP)

# The privileged GitHub jobs (comment, authorize, capacity, report, promote): only what
# `pipeline comment|chatops|promote|runners|validate` needs, every package pinned with its
# hashes (constraints/github-jobs.lock, made by constraints/lock.sh), no torch. Where the
# full development install already exists (a developer machine, the act tests' linked
# venv) it is a superset, and nothing is installed.
setup-github:
	@if [ -f $(STAMP) ]; then echo "setup-github: the full install in $(VENV) covers it"; exit 0; fi; \
	set -e; test -x $(BIN)/python || $(PY) -m venv $(VENV); \
	$(BIN)/python -m pip install -q --require-hashes --no-deps -r constraints/github-jobs.lock; \
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .

# The GPU training job (experiment-train.yml `train`), before the trainer's credential is used:
# every package, torch and its CUDA wheels included, pinned with its hashes
# (constraints/gpu-train.lock, made by constraints/lock.sh). The build backend is installed
# first from its own hashed lock, and nothing builds in an isolated environment, so no build
# tool is fetched unhashed; then the project itself without dependencies. A fresh runner has
# no stamp; a full install is a superset.
setup-train:
	@if [ -f $(STAMP) ]; then echo "setup-train: the full install in $(VENV) covers it"; exit 0; fi; \
	set -e; test -x $(BIN)/python || $(PY) -m venv $(VENV); \
	$(BIN)/python -m pip install -q --require-hashes --no-deps -r constraints/build-tools.lock; \
	$(BIN)/python -m pip install -q --require-hashes --no-deps --no-build-isolation -r constraints/gpu-train.lock; \
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .

demo: setup
	$(BIN)/pipeline demo --experiment $(EXPERIMENT)

# The whole suite on TEST_WORKERS xdist workers (the Slurm tests share one worker); the JUnit
# file feeds `make test-budget` (.ci/test_budget.py: tiers, slowest tests, new tests' budget).
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --junitxml=$(JUNIT)

# The unit tier: no process, no server (tests/infra/tiers.py fails a test that starts one).
test-fast: setup
	$(BIN)/python -m pytest -q tests/unit

test-budget:
	$(PY) .ci/test_budget.py $(JUNIT)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: setup
	$(BIN)/python bench/run_all.py

# GPU acceptance (bench/README.md): `make gpu-check-prepare` here writes the folder to carry
# (data, specs, dry runs, wheels); `make gpu-check` on the GPU machine runs every part with that
# machine's own python3 (no venv, no registry) in at most 8 minutes, then writes the JSON, the
# RESULTS.md section and the logs to GPU_CHECK_OUT.
GPU_CHECK_CARRY ?= data/gpu-check
GPU_CHECK_OUT ?= $(GPU_CHECK_CARRY)/out
GPU_PY ?= python3
gpu-check-prepare: setup
	$(BIN)/python bench/gpu_check.py prepare --carry $(GPU_CHECK_CARRY)

gpu-check:
	PYTHONUNBUFFERED=1 $(GPU_PY) bench/gpu_check.py run --carry $(GPU_CHECK_CARRY) --out $(GPU_CHECK_OUT) --append

clean:
	rm -rf runs data/cache mlflow.db mlruns
