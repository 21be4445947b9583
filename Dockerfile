# alignflow image: CPU by default; a CUDA build through a build argument:
#   docker build -t alignflow:cpu .
#   docker build -t alignflow:cuda --build-arg BASE_IMAGE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04 \
#       --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu124 .
# The base must provide python3.11 with venv (python:3.11-slim-bookworm does; a CUDA base may
# need it installed). Where no registry can be reached, `make image` builds the base from Debian
# packages (tools/build_base_image.sh) and passes it here as BASE_IMAGE.
#
# Machine-specific package-index settings never go into a layer: they come as BuildKit secrets,
# mounted only while pip runs (tools/build_image.sh passes them):
#   --secret id=pip.conf,src=<a pip.conf>   e.g. an index-url of a mirror (may hold credentials)
#   --secret id=ca.crt,src=<CA bundle>      a CA bundle pip should trust (a TLS-inspecting proxy)
# and wheels placed in requirements/wheels/ (ignored by git) are used before any index, e.g.
# a local torch CPU wheel; without them torch comes from TORCH_INDEX.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# wheels from the build context, mounted into the pip step (never copied into the image);
# lock.txt is named so that the COPY has a source when requirements/wheels/ holds nothing
FROM scratch AS wheels
COPY requirements/lock.txt requirements/wheels* /wheels/

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
    DO_NOT_TRACK=1 \
    HF_HUB_OFFLINE=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# git is needed by DVC and for the git.commit tag on every run; curl for health checks
RUN apt-get update \
    && apt-get install -y --no-install-recommends git=1:2.39.* ca-certificates=20230311* curl=7.88.* \
    && rm -rf /var/lib/apt/lists/*

# a virtual environment: the same on python:3.11-slim and on Debian's python3 (which refuses
# system-wide pip installs, PEP 668)
RUN python3 -m venv /opt/venv && useradd --create-home --uid 1000 alignflow
WORKDIR /app

# pip with the build's secrets: a pip.conf and a CA bundle when given, nothing otherwise
COPY deploy/docker/pip-build /usr/local/bin/pip-build

# Layer 1: torch (largest, changes least), at the locked version: a CPU wheel from
# requirements/wheels/ when there is one, else from TORCH_INDEX
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    --mount=type=secret,id=pip.conf --mount=type=secret,id=ca.crt \
    if ls /wheels/torch-"${TORCH_VERSION}"*.whl >/dev/null 2>&1; then \
        pip-build install --no-index --find-links /wheels "torch==${TORCH_VERSION}" --no-deps \
        && pip-build install "torch==${TORCH_VERSION}" --find-links /wheels -c /wheels/lock.txt; \
    else \
        pip-build install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"; \
    fi

# Layer 2: dependencies only, at the versions in the lock, so code edits do not reinstall them
# (an empty README.md stands in for the real one, which pyproject.toml names: a README edit
# must not reinstall every dependency)
COPY pyproject.toml ./
COPY requirements/lock.txt requirements/lock.txt
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    --mount=type=secret,id=pip.conf --mount=type=secret,id=ca.crt \
    mkdir -p alignflow \
    && touch README.md alignflow/__init__.py \
    && pip-build install --find-links /wheels -c requirements/lock.txt . \
    && pip uninstall -y alignflow

# Layer 3: the code
COPY README.md ./
COPY alignflow ./alignflow
COPY configs ./configs
COPY deploy ./deploy
COPY prefect.yaml ./
RUN pip install --no-deps --no-build-isolation . \
    && chown -R alignflow:alignflow /app \
    && mkdir -p /work && chown alignflow:alignflow /work

# runs keep their stores (data, DVC, outputs, MLflow's default sqlite, Prefect results) in the
# working directory: mount a volume here, e.g. docker run -v alignflow-work:/work alignflow:cpu run
WORKDIR /work
USER 1000:1000
RUN git config --global user.name alignflow \
    && git config --global user.email alignflow@localhost \
    && git config --global init.defaultBranch main
ENTRYPOINT ["alignflow"]
CMD ["--help"]
