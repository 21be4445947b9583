#!/usr/bin/env bash
# Builds the alignflow image (`make image` runs this) on a machine with or without a registry:
#
#   tools/build_image.sh                 # -> alignflow:cpu
#   IMAGE=alignflow:dev BASE_IMAGE=python:3.11-slim-bookworm tools/build_image.sh
#
# - Base: BASE_IMAGE when set; else python:3.11-slim-bookworm when it is present or can be
#   pulled; else alignflow-base:bookworm, made from Debian packages by tools/build_base_image.sh
#   (needs root and debootstrap).
# - torch: a CPU wheel of the locked version that pip can find without an index (its
#   configured find-links, or TORCH_WHEEL=<path to a .whl>) is staged in requirements/wheels/;
#   without one the image takes torch from the Dockerfile's TORCH_INDEX.
# - Package-index settings go in as BuildKit secrets, never into a layer: the CA bundle pip
#   trusts here (PIP_BUILD_CA, else PIP_CERT, else pip's configured cert) and a pip.conf with
#   this machine's http(s) index-url / extra-index-url, when it has any.
# Extra `docker build` arguments pass through: tools/build_image.sh --no-cache
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-alignflow:cpu}
PYTHON=${PYTHON:-python3}
DEFAULT_BASE=python:3.11-slim-bookworm
DEBIAN_BASE=${DEBIAN_BASE:-alignflow-base:bookworm}
TORCH_VERSION=$(sed -n 's/^torch==\([^ ;]*\).*/\1/p' requirements/lock.txt)

# a docker client that builds with BuildKit (RUN --mount): buildx, or a client before 23.0
# (BuildKit built in); the first one on PATH that can
pick_docker() {
    local candidate
    for candidate in ${DOCKER:-} $(type -ap docker); do
        if "$candidate" buildx version >/dev/null 2>&1; then echo "$candidate"; return; fi
        local major
        major=$("$candidate" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)
        if [ -n "$major" ] && [ "$major" -lt 23 ] 2>/dev/null; then echo "$candidate"; return; fi
    done
    echo "no docker client with BuildKit found: install the buildx plugin" >&2
    return 1
}
DOCKER_BIN=$(pick_docker)

if [ -z "${BASE_IMAGE:-}" ]; then
    if "$DOCKER_BIN" image inspect "$DEFAULT_BASE" >/dev/null 2>&1 \
        || timeout "${PULL_TIMEOUT:-60}" "$DOCKER_BIN" pull -q "$DEFAULT_BASE" >/dev/null 2>&1; then
        BASE_IMAGE=$DEFAULT_BASE
    else
        echo "cannot pull $DEFAULT_BASE: building $DEBIAN_BASE from Debian packages"
        BASE_TAG=$DEBIAN_BASE tools/build_base_image.sh
        BASE_IMAGE=$DEBIAN_BASE
    fi
fi

mkdir -p requirements/wheels
if [ -n "${TORCH_WHEEL:-}" ]; then
    cp -f "$TORCH_WHEEL" requirements/wheels/
elif ! ls requirements/wheels/torch-"$TORCH_VERSION"*.whl >/dev/null 2>&1; then
    # only what pip finds without an index (a local wheel): a PyPI torch is the CUDA build
    "$PYTHON" -m pip download --quiet --no-deps --no-index -d requirements/wheels \
        "torch==$TORCH_VERSION+cpu" 2>/dev/null \
        || echo "no local torch $TORCH_VERSION+cpu wheel: the image installs torch from TORCH_INDEX"
fi

secrets=()
secret_dir=$(mktemp -d)
trap 'rm -rf "$secret_dir"' EXIT
ca=${PIP_BUILD_CA:-${PIP_CERT:-$("$PYTHON" -m pip config get global.cert 2>/dev/null || true)}}
if [ -n "$ca" ] && [ -s "$ca" ]; then
    secrets+=(--secret "id=ca.crt,src=$ca")
fi
{
    echo "[global]"
    for key in index-url extra-index-url; do
        env_key=PIP_$(echo "$key" | tr a-z- A-Z_)
        value=${!env_key:-$("$PYTHON" -m pip config get "global.$key" 2>/dev/null || true)}
        # file:// indexes and paths of this machine mean nothing inside the build
        value=$(echo "$value" | tr ' ' '\n' | grep -E '^https?://' | tr '\n' ' ' || true)
        if [ -n "${value// /}" ]; then echo "$key = $value"; fi
    done
} >"$secret_dir/pip.conf"
if [ "$(wc -l <"$secret_dir/pip.conf")" -gt 1 ]; then
    secrets+=(--secret "id=pip.conf,src=$secret_dir/pip.conf")
fi

echo "building $IMAGE on $BASE_IMAGE (torch $TORCH_VERSION; $(ls requirements/wheels/*.whl 2>/dev/null | wc -l) local wheel(s); ${#secrets[@]} secret args)"
DOCKER_BUILDKIT=1 "$DOCKER_BIN" build \
    --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    --build-arg "TORCH_VERSION=$TORCH_VERSION" \
    "${secrets[@]}" \
    -t "$IMAGE" "$@" .
echo "built $IMAGE"
