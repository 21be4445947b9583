# Two commands do all set-up: `make demo` and `make test`. Both install first.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
export HF_HUB_OFFLINE := 1
export GX_ANALYTICS_ENABLED := False
export DO_NOT_TRACK := 1
# every package at the version the suite last passed with (`make lock` refreshes it)
LOCK := requirements/lock.txt

.PHONY: install demo test bench lint format lock lock-check

install:
	# torch first, at the locked version: the CPU wheel; a bare requirement would pull a multi-GB CUDA build
	$(PIP) install --quiet -c $(LOCK) torch
	$(PIP) install --quiet -c $(LOCK) -e ".[dev]"
	$(PYTHON) -m tools.lockfile verify-installed

# re-resolve every dependency (after editing pyproject.toml, or to take new releases); then
# `make test` and commit pyproject.toml and the lock together
lock:
	$(PIP) install --quiet -c $(LOCK) uv
	$(PYTHON) -m tools.lockfile refresh

# fails when pyproject.toml declares other dependencies than the lock was resolved from
lock-check:
	$(PYTHON) -m tools.lockfile check

# the main job on the embedded defaults: validate + version the demo data, train, evaluate,
# register and promote (Prefect ephemeral API, MLflow in ./mlflow.db, local DVC remote)
demo: install
	$(PYTHON) -m alignflow.cli run --config configs/demo.yaml

test: install
	$(PYTHON) -m pytest -q

bench: install
	$(PYTHON) -m bench

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	hadolint Dockerfile

format:
	$(PYTHON) -m ruff check --fix .
	$(PYTHON) -m ruff format .
