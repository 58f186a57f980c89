#!/usr/bin/env bash
# The second real engine: llama.cpp's server (llama-server), built for this machine's CPU from the llama.cpp
# that PyPI's llama-cpp-python sdist vendors (vendor/llama.cpp), into a cache (default
# .cache/llamacpp/<version>/), with a small environment for writing the tiny GGUF model the tests serve
# (the sdist's own gguf-py, with numpy). Done once; a stamp says which pins it holds, so a change of pins
# rebuilds it.
#
# The build is the slow part: about 25 minutes on 2 loaded cores (llama-server alone, static ggml). No
# network at run time: LLAMA_USE_PREBUILT_UI must be OFF or the build downloads the web UI; no curl, no
# OpenSSL (the tests speak plain HTTP to 127.0.0.1).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
VERSION=0.3.36                      # llama-cpp-python; vendors llama.cpp at commit 0c1e570
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
DEST="${LLAMACPP_DIR:-.cache/llamacpp/$VERSION}"
JOBS="${JOBS:-$(nproc)}"
CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
-DBUILD_SHARED_LIBS=OFF"
PINS="llama-cpp-python==$VERSION sha256:$SHA256 $CMAKE_FLAGS venv:gguf-py"
STAMP="$DEST/.llmslo-pins"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PINS" ] && "$DEST/llama-server" --version >/dev/null 2>&1 \
   && "$DEST/venv/bin/python" -c 'import gguf' 2>/dev/null; then
  exit 0
fi

echo "building llama.cpp's server into $DEST from llama-cpp-python==$VERSION (about 25 minutes on 2 cores)" >&2
start=$(date +%s)
rm -rf "$DEST"
mkdir -p "$DEST/download"
"$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$DEST/download"
tarball="$DEST/download/llama_cpp_python-$VERSION.tar.gz"
echo "$SHA256  $tarball" | sha256sum -c --quiet -
tar -xzf "$tarball" -C "$DEST/download"
src="$DEST/download/llama_cpp_python-$VERSION/vendor/llama.cpp"

# The model writer first (a minute; a failure here should not wait for the build): numpy and the sdist's gguf-py.
"$PY" -m venv "$DEST/venv"
"$DEST/venv/bin/pip" install -q "$src/gguf-py"
"$DEST/venv/bin/python" -c 'import gguf, numpy'

# shellcheck disable=SC2086
cmake -S "$src" -B "$DEST/build" $CMAKE_FLAGS >"$DEST/cmake.log" 2>&1 || { tail -30 "$DEST/cmake.log" >&2; exit 1; }
cmake --build "$DEST/build" --target llama-server -j "$JOBS" >"$DEST/build.log" 2>&1 || { tail -30 "$DEST/build.log" >&2; exit 1; }
cp "$DEST/build/bin/llama-server" "$DEST/llama-server"
# The server's source, which defines its /metrics (tools/server/server-context.cpp), kept for reading.
cp -r "$src/tools/server" "$DEST/server-source"

rm -rf "$DEST/build" "$DEST/download"
"$DEST/llama-server" --version >&2 2>&1 || true
echo "$PINS" > "$STAMP"
echo "llama-server built in $(( $(date +%s) - start )) s: $DEST/llama-server" >&2
