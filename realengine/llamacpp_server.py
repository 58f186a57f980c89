"""Start and stop a real llama.cpp server (`llama-server`, CPU build) as a child process.

`scripts/install-llamacpp.sh` (`make llamacpp-deps`) builds the server from the llama.cpp that PyPI's
llama-cpp-python sdist vendors, into .cache/llamacpp/<version>/, with a small environment that writes the GGUF
model (realengine/build_gguf.py). One process, one model: `-np` slots, each a request at a time with its own
share of the context (`-c` / `-np`); a request that finds no free slot is deferred until one frees.
Everything runs on loopback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from realengine.vllm_server import REPO, free_port

VERSION = "0.3.36"  # llama-cpp-python's sdist, as scripts/install-llamacpp.sh pins it (llama.cpp 0c1e570)
LLAMACPP_COMMIT = "0c1e570"
GGUF_BUILDER = Path(__file__).resolve().parent / "build_gguf.py"
SERVED_NAME = "tiny-llama"  # --alias: the model id on /v1/models and in responses
INSTALL_FIX = "run `make llamacpp-deps` (scripts/install-llamacpp.sh; about 25 minutes on 2 cores, once)"


def install_dir() -> Path:
    """Where the build lives: $LLMSLO_LLAMACPP_DIR, else .cache/llamacpp/<version>."""
    explicit = os.environ.get("LLMSLO_LLAMACPP_DIR")
    return Path(explicit) if explicit else REPO / ".cache" / "llamacpp" / VERSION


def server_binary() -> Path:
    return install_dir() / "llama-server"


def gguf_python() -> Path:
    """The interpreter that has numpy and gguf-py (the build's own small environment)."""
    return install_dir() / "venv" / "bin" / "python"


def available() -> str | None:
    """None when the server and the model writer are installed, else why not (with the fix)."""
    for path, what in ((server_binary(), "llama.cpp's server"), (gguf_python(), "the GGUF writer's environment")):
        if not path.exists():
            return f"{what} is not built ({path} does not exist): {INSTALL_FIX}"
    return None


def model_path(cache: Path | None = None, seed: int = 0) -> Path:
    """The tiny GGUF model, written once (seeded random weights) and cached."""
    cache = cache or Path(os.environ.get("LLMSLO_CACHE", REPO / ".cache")) / "realengine"
    out = cache / f"tiny-llama-s{seed}.gguf"
    if not out.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(gguf_python()), str(GGUF_BUILDER), str(out), "--seed", str(seed)], check=True,
                       stdout=subprocess.DEVNULL)
    return out


@dataclass
class LlamacppConfig:
    """What the server is started with. The defaults: 4 slots of 2,048 tokens each, one thread (the rest of the
    machine runs the stack), /metrics on."""

    slots: int = 4
    ctx_per_slot: int = 2048
    threads: int = 1
    served_name: str = SERVED_NAME
    port: int = 0
    extra_args: list[str] = field(default_factory=list)

    def argv(self, model: Path, port: int) -> list[str]:
        return [
            str(server_binary()), "-m", str(model), "--alias", self.served_name,
            "--host", "127.0.0.1", "--port", str(port), "--metrics",
            "-c", str(self.slots * self.ctx_per_slot), "-np", str(self.slots),
            "-t", str(self.threads), "-tb", str(self.threads), "--no-webui",
            *self.extra_args,
        ]


class LlamacppServer:
    """One real llama-server on loopback; a context manager."""

    def __init__(self, config: LlamacppConfig | None = None, log_path: Path | None = None,
                 model: Path | None = None):
        self.config = config or LlamacppConfig()
        self.port = self.config.port or free_port()
        self.model = model
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> "LlamacppServer":
        why = available()
        if why:
            raise RuntimeError(why)
        model = self.model or model_path()
        if self.log_path:
            self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.config.argv(model, self.port), start_new_session=True,
                                     stdin=subprocess.DEVNULL, stdout=self._log or subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise RuntimeError(f"llama-server exited with {code} while starting; log: {self.log_path}")
            try:  # 503 while the model loads, 200 once it serves
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama-server did not answer /health within {timeout:.0f} s; log: {self.log_path}")

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self._log:
            self._log.close()
            self._log = None
        self.proc = None

    def __enter__(self) -> "LlamacppServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """`python -m realengine.llamacpp_server [--port N]`: serve the tiny model until interrupted."""
    import argparse

    p = argparse.ArgumentParser(description="Serve the tiny random-weight Llama on llama.cpp's server (CPU build).")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--slots", type=int, default=LlamacppConfig.slots)
    a = p.parse_args(argv)
    server = LlamacppServer(LlamacppConfig(port=a.port, slots=a.slots))
    server.start()
    print(json.dumps({"url": server.url, "model": SERVED_NAME}), flush=True)
    try:
        while server.proc and server.proc.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
