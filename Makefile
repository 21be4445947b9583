# Two commands do all set-up: `make demo` and `make test`. Both install first.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
export HF_HUB_OFFLINE := 1
export GX_ANALYTICS_ENABLED := False
export DO_NOT_TRACK := 1
# every package at the version the suite last passed with (`make lock` refreshes it)
LOCK := requirements/lock.txt

.PHONY: install reinstall demo screenshots test bench lint typecheck format lock lock-check pins pins-check \
	base-image image postgres-image stack-up stack-down

install:
	@# skipped while the interpreter, lock, pyproject.toml and package sources are those of the last install
	@if $(PYTHON) -m tools.install_stamp check 2>/dev/null; then \
		echo "install: nothing to do (environment matches the lock and the sources)"; \
	else \
		$(MAKE) --no-print-directory reinstall; \
	fi

# torch first, at the locked version: the CPU wheel; a bare requirement would pull a multi-GB CUDA build
reinstall:
	$(PIP) install --quiet -c $(LOCK) torch
	$(PIP) install --quiet -c $(LOCK) -e ".[dev]"
	$(PYTHON) -m tools.lockfile verify-installed
	$(PYTHON) -m tools.install_stamp write

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

# the README's pictures of the MLflow and Prefect UIs, from a workspace where `make demo` and one
# rejected challenger ran (the commands: tools/screenshots.py); needs Debian's chromium
screenshots:
	$(PYTHON) -m tools.screenshots

# tests run in two worker processes, a test file per worker at a time (its module fixtures stay
# together), the long files first (tests/conftest.LONG_FILES); PYTEST_WORKERS=0 runs them in this process
PYTEST_WORKERS ?= 2
test: install
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

bench: install
	$(PYTHON) -m bench

lint: typecheck
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	hadolint Dockerfile

# mypy on the package, its flows and tasks included (its settings: [tool.mypy] in pyproject.toml)
typecheck: install
	$(PYTHON) -m mypy

format:
	$(PYTHON) -m ruff check --fix .
	$(PYTHON) -m ruff format .

# the demo's committed DVC pointers (data.dvc, golden.dvc) must be what its data stage writes:
# after changing the demo data, validation, the split or the snapshot format, refresh and commit them
pins:
	$(PYTHON) -m tools.demo_pins refresh

pins-check:
	$(PYTHON) -m tools.demo_pins check

# Images (mlflow/README.md, "The container stack"). `make image` builds alignflow:cpu; where no
# registry can be pulled from it first builds the base from Debian packages (`make base-image`,
# root + debootstrap). Settings: IMAGE, BASE_IMAGE, TORCH_WHEEL, PIP_BUILD_CA (tools/build_image.sh)
IMAGE ?= alignflow:cpu
DEBIAN_BASE ?= alignflow-base:bookworm
POSTGRES_IMAGE ?= alignflow-postgres:15
COMPOSE ?= docker-compose

base-image:
	BASE_TAG=$(DEBIAN_BASE) tools/build_base_image.sh

image:
	IMAGE=$(IMAGE) PYTHON=$(PYTHON) tools/build_image.sh

# PostgreSQL from Debian's postgresql-15 on the Debian base (for the compose stack offline)
postgres-image: base-image
	DOCKER_BUILDKIT=0 docker build -t $(POSTGRES_IMAGE) --build-arg BASE_IMAGE=$(DEBIAN_BASE) mlflow/postgres

stack-up:
	POSTGRES_IMAGE=$(POSTGRES_IMAGE) ALIGNFLOW_IMAGE=$(IMAGE) $(COMPOSE) -f mlflow/compose.yaml up -d

stack-down:
	$(COMPOSE) -f mlflow/compose.yaml down
