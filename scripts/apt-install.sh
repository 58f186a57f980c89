#!/usr/bin/env bash
# Installs the Debian packages named as arguments (none: nothing to do), through sudo when not root; the
# package lists are refreshed only when the install from the current ones fails. The install-*-deps.sh
# scripts call it with what they found missing.
set -euo pipefail
[ $# -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "installing Debian packages: $*" >&2
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >/dev/null \
  || { $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >/dev/null; }
