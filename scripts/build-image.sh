#!/usr/bin/env bash
# Builds deploy/Dockerfile with Debian's buildah (no daemon): `make image`.
#
# The Dockerfile's base (PYTHON_IMAGE) is pulled when a registry can be reached. When it cannot,
# a base is made here instead: debootstrap of Debian bookworm (python3 3.11, venv, ca-certificates),
# committed once as localhost/llmslo-base:<tag> and reused by every later build (the cache).
# pip inside the build trusts the host pip's CA bundle, mounted as a build secret (never a layer),
# and uses the host pip's index URL when one is configured.
#
# Environment: IMAGE (default localhost/llmslo:dev), PYTHON_IMAGE (the base to try first;
# default: the Dockerfile's), DEBIAN_MIRROR (default http://deb.debian.org/debian),
# STORAGE_DRIVER (default vfs) and BUILDAH_ISOLATION (default chroot): what works inside an
# unprivileged container or sandbox without fuse-overlayfs or a runtime.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-localhost/llmslo:dev}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,python-is-python3,ca-certificates
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
export BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}

die() { echo "build-image: $*" >&2; exit 1; }
command -v buildah >/dev/null || die "buildah is missing: run scripts/install-image-deps.sh (or make image)"
[ "$(id -u)" -eq 0 ] || die "run as root (buildah with --isolation chroot and debootstrap need it), e.g. sudo make image"

dockerfile_base=$(sed -n 's/^ARG PYTHON_IMAGE=\(.*\)$/\1/p' deploy/Dockerfile)
[ -n "$dockerfile_base" ] || die "deploy/Dockerfile: no 'ARG PYTHON_IMAGE=<image>' line to take the base from"
base=${PYTHON_IMAGE:-$dockerfile_base}

# The base: pulled if possible, else the cached local one, else debootstrapped now.
if buildah inspect --type image "$base" >/dev/null 2>&1; then
  echo "build-image: base $base (already in local storage)" >&2
elif timeout 60 buildah pull --quiet "$base" >/dev/null 2>&1; then
  echo "build-image: base $base (pulled)" >&2
else
  # The tag names what the base is made of, so a change of packages or suite makes a new one.
  tag="$SUITE-$(printf '%s %s' "$SUITE" "$BASE_PACKAGES" | sha256sum | cut -c1-12)"
  local_base="localhost/llmslo-base:$tag"
  echo "build-image: cannot pull $base (no registry reachable?); using $local_base" >&2
  if ! buildah inspect --type image "$local_base" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null || die "debootstrap is missing: run scripts/install-image-deps.sh"
    work=$(mktemp -d /var/tmp/llmslo-base.XXXXXX)
    trap 'rm -rf "$work"' EXIT
    echo "build-image: debootstrap $SUITE ($BASE_PACKAGES) from $DEBIAN_MIRROR" >&2
    debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$work/rootfs" "$DEBIAN_MIRROR" \
      >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
    rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/* "$work"/rootfs/var/log/*
    tar -C "$work/rootfs" --numeric-owner -cf "$work/rootfs.tar" .
    ctr=$(buildah from scratch)
    buildah add --quiet "$ctr" "$work/rootfs.tar" / >/dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --env LANG=C.UTF-8 --cmd python3 \
      --label org.opencontainers.image.description="Debian $SUITE minbase + $BASE_PACKAGES (scripts/build-image.sh)" "$ctr"
    buildah commit --quiet --rm "$ctr" "$local_base" >/dev/null
    rm -rf "$work"; trap - EXIT
  fi
  base=$local_base
fi

# pip's CA bundle and index as the host's pip has them (env first, then pip's config files).
host_pip() { if [ -x .venv/bin/pip ]; then .venv/bin/pip "$@"; else python3 -m pip "$@"; fi; }
ca=${PIP_CERT:-$(host_pip config get global.cert 2>/dev/null || true)}
ca=${ca:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}
[ -s "$ca" ] || die "pip's CA bundle $ca is missing or empty (set PIP_CERT to the bundle your pip trusts)"
index=${PIP_INDEX_URL:-$(host_pip config get global.index-url 2>/dev/null || true)}

args=(--layers --isolation "$BUILDAH_ISOLATION" -f deploy/Dockerfile -t "$IMAGE"
      --ignorefile deploy/Dockerfile.dockerignore
      --build-arg "PYTHON_IMAGE=$base" --secret "id=pip-ca,src=$ca")
[ -n "$index" ] && args+=(--build-arg "PIP_INDEX_URL=$index")
echo "build-image: buildah bud $IMAGE from $base (pip CA: $ca${index:+, index: $index})" >&2
buildah bud "${args[@]}" .
echo "build-image: built $IMAGE" >&2
