#!/usr/bin/env bash
# Builds a Debian bookworm base image from Debian packages alone (debootstrap + docker import),
# for machines that cannot pull from a registry. The image has Python 3.11 (bookworm's python3)
# with venv, and CA certificates; the alignflow Dockerfile takes it through BASE_IMAGE:
#
#   sudo tools/build_base_image.sh                      # -> alignflow-base:bookworm
#   make image BASE_IMAGE=alignflow-base:bookworm
#
# Needs root, debootstrap (apt-get install debootstrap) and a running docker daemon.
# Settings (environment): BASE_TAG, DEBIAN_MIRROR (default: the mirror this host's apt uses,
# else http://deb.debian.org/debian), DEBIAN_SECURITY_MIRROR, SUITE (bookworm), EXTRA_PACKAGES.
# Nothing of this host goes into the image except the mirror URLs in its apt sources.
set -euo pipefail

SUITE=${SUITE:-bookworm}
BASE_TAG=${BASE_TAG:-alignflow-base:${SUITE}}
PACKAGES="python3,python3-venv,ca-certificates${EXTRA_PACKAGES:+,${EXTRA_PACKAGES}}"

host_mirror() {
    # the first Debian main-archive URI apt is configured with (one-line or deb822 sources)
    local files=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources)
    grep -hoE 'https?://[^ ]+/debian/?( |$)' "${files[@]}" 2>/dev/null | grep -v security \
        | head -n1 | tr -d ' ' | sed 's:/$::' || true
}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-$(host_mirror)}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBIAN_SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-${DEBIAN_MIRROR%/debian}/debian-security}

if docker image inspect "$BASE_TAG" >/dev/null 2>&1 && [ "${FORCE:-0}" != 1 ]; then
    echo "base image $BASE_TAG exists (FORCE=1 rebuilds it)"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "debootstrap needs root: run as root or with sudo" >&2
    exit 1
fi
command -v debootstrap >/dev/null || { echo "needs debootstrap: apt-get install -y debootstrap" >&2; exit 1; }

rootfs=$(mktemp -d /tmp/alignflow-rootfs.XXXXXX)
trap 'rm -rf --one-file-system "$rootfs"' EXIT

echo "debootstrap $SUITE from $DEBIAN_MIRROR into $rootfs (packages: $PACKAGES)"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$DEBIAN_MIRROR"

cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $DEBIAN_MIRROR $SUITE main
deb $DEBIAN_MIRROR $SUITE-updates main
deb $DEBIAN_SECURITY_MIRROR $SUITE-security main
EOF
# what the official debian images do: no docs or caches in layers, no daemons started by apt
cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";
EOF
printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
chmod +x "$rootfs/usr/sbin/policy-rc.d"
chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/tmp/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*

tar -C "$rootfs" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --message "debootstrap --variant=minbase $SUITE ($PACKAGES) from $DEBIAN_MIRROR" \
    - "$BASE_TAG"
docker run --rm "$BASE_TAG" python3 --version
echo "built $BASE_TAG"
