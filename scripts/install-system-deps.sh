#!/usr/bin/env bash
# Installs the Debian packages the stack runs for real (promtool, Prometheus, Alertmanager and amtool, nginx,
# VictoriaMetrics for the fleet backend) when missing.
set -euo pipefail
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# Debian's prometheus-alertmanager ships amtool too (the tests run `amtool check-config` on alerts/alertmanager.yaml).
{ command -v prometheus-alertmanager >/dev/null 2>&1 || command -v alertmanager >/dev/null 2>&1; } \
  && command -v amtool >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v nginx >/dev/null 2>&1 || need+=(nginx-light)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# Debian's victoria-metrics ships the single-node store (victoria-metrics) with vmagent and vmalert (the fleet demo).
{ command -v victoria-metrics >/dev/null 2>&1 && command -v vmalert >/dev/null 2>&1 && command -v vmagent >/dev/null 2>&1; } \
  || need+=(victoria-metrics)
[ ${#need[@]} -eq 0 ] && exit 0
"$(dirname "$0")/apt-install.sh" "${need[@]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
# The Debian packages start services; the stack starts its own on loopback.
for svc in prometheus prometheus-alertmanager prometheus-node-exporter nginx victoria-metrics; do
  $sudo service "$svc" stop >/dev/null 2>&1 || true
done
