"""Start and stop a real llama.cpp server (`llama-server`, CPU build) as a child process.

`scripts/install-llamacpp.sh` (`make llamacpp-deps`) builds the server from the llama.cpp that PyPI's
llama-cpp-python sdist vendors, into .cache/llamacpp/<version>/, with a small environment that writes the GGUF
model (realengine/build_gguf.py). One process, one model: `-np` slots, each a request at a time with its own
share of the context (`-c` / `-np`); a request that finds no free slot is deferred until one frees.
Everything runs on loopback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from realengine.process import REPO, EngineProcess, cache_dir, serve_main

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
    cache = cache or cache_dir()
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


class LlamacppServer(EngineProcess):
    """One real llama-server on loopback (a single process); a context manager."""

    name = "llama-server"
    poll_s = 0.2
    start_timeout_s = 120.0

    def __init__(self, config: LlamacppConfig | None = None, log_path: Path | None = None,
                 model: Path | None = None):
        self.config = config or LlamacppConfig()
        super().__init__(self.config.port, log_path)
        self.model = model

    def available(self) -> str | None:
        return available()

    def argv(self) -> list[str]:
        self.model = self.model or model_path()
        return self.config.argv(self.model, self.port)


def main(argv: list[str] | None = None) -> int:
    """`python -m realengine.llamacpp_server [--port N] [--slots N]`: serve the tiny model until interrupted."""
    return serve_main(argv, "Serve the tiny random-weight Llama on llama.cpp's server (CPU build).", 8080, "--slots",
                      LlamacppConfig.slots, lambda port, slots: LlamacppServer(LlamacppConfig(port=port, slots=slots)),
                      SERVED_NAME)


if __name__ == "__main__":
    sys.exit(main())
