#!/usr/bin/env bash
# GPU smoke test: make every NVML call the exporter makes (through its own provider, one line per call), run
# the exporter with real NVML for a few cycles and print each GPU series beside nvidia-smi's value (memory,
# utilisation, power, energy, temperature, clocks, clock-event reasons, ECC, PCIe replays, processes, MIG,
# identity; XID against the kernel log), check the page with promtool, print a verdict. docs/exporter.md.
#
#   scripts/gpu-smoke.sh [--cycles N] [--interval SECONDS]
#
# Exit 0: every check passed. 1: a check failed. 77: skipped (no NVIDIA driver or GPU here; the reason is
# printed). Needs the repository's virtual environment (make deps) or PYTHON=/path/to/python with the
# exporter's dependencies and nvidia-ml-py; promtool is used when installed. The logic is
# tools/gpu_smoke.py (tested on recorded nvidia-smi output: tests/exporter/test_gpu_smoke.py).
set -u
cd "$(dirname "$0")/.." || exit 1

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "SKIPPED: nvidia-smi not found on PATH: no NVIDIA driver on this machine" >&2
    exit 77
fi
python=${PYTHON:-}
if [ -z "$python" ]; then
    if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
if ! "$python" -c "import exporter, aiohttp" >/dev/null 2>&1; then
    echo "FAIL: $python cannot import the exporter (run make deps, or set PYTHON)" >&2
    exit 1
fi
exec "$python" -m tools.gpu_smoke "$@"
