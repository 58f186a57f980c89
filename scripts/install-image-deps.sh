#!/usr/bin/env bash
# Installs what `make image` needs from Debian when missing: buildah (builds deploy/Dockerfile
# without a daemon) and debootstrap (a local base image when no registry can be reached).
# Only the image step calls this; `make test` does not need either.
set -euo pipefail
need=()
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "installing Debian packages: ${need[*]}" >&2
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >/dev/null \
  || { $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; }
