#!/usr/bin/env bash
# Installs what the image steps need from Debian when missing: buildah (builds deploy/Dockerfile
# without a daemon) and debootstrap (a local base image when no registry can be reached) for
# `make image`; skopeo (copies, signs and verifies images) and docker-registry (the CNCF
# distribution registry, run on loopback) for `make image-verify` and `make release`.
# Only the image steps call this; `make test` needs none of them.
set -euo pipefail
need=()
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v skopeo >/dev/null 2>&1 || need+=(skopeo)
command -v docker-registry >/dev/null 2>&1 || need+=(docker-registry)
"$(dirname "$0")/apt-install.sh" "${need[@]}"
