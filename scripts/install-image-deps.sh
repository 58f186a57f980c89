#!/usr/bin/env bash
# Installs what `make image` needs from Debian when missing: buildah (builds deploy/Dockerfile
# without a daemon) and debootstrap (a local base image when no registry can be reached).
# Only the image step calls this; `make test` does not need either.
set -euo pipefail
need=()
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
"$(dirname "$0")/apt-install.sh" "${need[@]}"
