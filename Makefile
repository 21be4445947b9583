# Two commands do all set-up: `make demo` and `make test`. Both install first.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
export HF_HUB_OFFLINE := 1
export GX_ANALYTICS_ENABLED := False
export DO_NOT_TRACK := 1

.PHONY: install demo test bench lint format

install:
	# torch first: the CPU wheel; a bare requirement would pull a multi-GB CUDA build
	$(PIP) install --quiet "torch==2.13.0"
	$(PIP) install --quiet -e ".[dev]"

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
