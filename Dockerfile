# alignflow image: CPU by default; a CUDA build through a build argument:
#   docker build -t alignflow:cpu .
#   docker build -t alignflow:cuda --build-arg BASE_IMAGE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04 \
#       --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu124 .
# The CUDA base must provide python3.11 (or install it in the first stage below).
ARG BASE_IMAGE=python:3.11-slim-bookworm
# the tag is pinned in BASE_IMAGE above; hadolint cannot see through the build argument
# hadolint ignore=DL3006
FROM ${BASE_IMAGE}

# keep TORCH_VERSION equal to torch's pin in requirements/lock.txt
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GX_ANALYTICS_ENABLED=False \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    DO_NOT_TRACK=1

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# git is needed by DVC and for the git.commit tag on every run
RUN apt-get update \
    && apt-get install -y --no-install-recommends git=1:2.39.* ca-certificates=20230311* \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 alignflow
WORKDIR /app

# Layer 1: torch (largest, changes least), at the locked version
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"

# Layer 2: dependencies only, at the versions in the lock, so code edits do not reinstall them
COPY pyproject.toml README.md ./
COPY requirements/lock.txt requirements/lock.txt
RUN mkdir -p alignflow tasks flows \
    && touch alignflow/__init__.py tasks/__init__.py flows/__init__.py \
    && pip install -c requirements/lock.txt . \
    && pip uninstall -y alignflow

# Layer 3: the code
COPY alignflow ./alignflow
COPY tasks ./tasks
COPY flows ./flows
COPY configs ./configs
COPY prefect.yaml ./
RUN pip install --no-deps . && chown -R alignflow:alignflow /app

USER 1000:1000
ENTRYPOINT ["alignflow"]
CMD ["--help"]
