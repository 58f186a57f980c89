"""The interim demo's orchestration: start, watch, stop. Every process started is stopped."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from demo import summary
from demo.pages import FakeVllmPage, start_page_server
from exporter import promtext

MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct")
READY_TIMEOUT_S = 20.0
LOG_DIR = Path(".demo")  # git-ignored; the processes' logs, for when something does not come up


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Started:
    """What the demo started, so that stop() can undo exactly that."""

    processes: list[subprocess.Popen] = field(default_factory=list)
    runners: list = field(default_factory=list)

    def spawn(self, argv: list[str], log_name: str) -> subprocess.Popen:
        """Start a process in its own session (so its children stop with it), logging to .demo/<log_name>."""
        LOG_DIR.mkdir(exist_ok=True)
        with open(LOG_DIR / log_name, "wb") as log:
            proc = subprocess.Popen(argv, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(proc)
        return proc

    async def stop(self) -> None:
        for proc in reversed(self.processes):
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.processes:
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for runner in self.runners:
            await runner.cleanup()


async def wait_http(session: aiohttp.ClientSession, url: str, proc: subprocess.Popen | None = None) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        with suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                if resp.status == 200:
                    return True
        await asyncio.sleep(0.2)
    return False


async def start_engines(started: Started, session: aiohttp.ClientSession, duration: float | None, source: str) -> list[str]:
    """The simulator if it is installed and comes up; otherwise the built-in pages. Returns --engine values."""
    if source != "builtin" and importlib.util.find_spec("simulator.api") is not None:
        port = free_port()
        proc = started.spawn([sys.executable, "-m", "simulator.cli", "serve", "--host", "127.0.0.1", "--port", str(port)], "simulator.log")
        if await wait_http(session, f"http://127.0.0.1:{port}/metrics", proc):
            print(f"engine: simulator on 127.0.0.1:{port}")
            if importlib.util.find_spec("simulator.loadgen") is not None:
                started.spawn([sys.executable, "-m", "simulator.loadgen", "--url", f"http://127.0.0.1:{port}",
                               "--rate", "4", "--duration", str(int(duration or 3600))], "loadgen.log")
            return [f"vllm=http://127.0.0.1:{port}/metrics"]
        print("engine: the simulator did not come up; using the built-in page generator instead")
    runner, urls = await start_page_server([FakeVllmPage(m, seed=i) for i, m in enumerate(MODELS)])
    started.runners.append(runner)
    print(f"engine: built-in vLLM-shaped pages at {', '.join(urls)}")
    return [f"vllm={u}" for u in urls]


async def run(duration: float | None, gpus: int, interval: float, source: str = "auto") -> int:
    started = Started()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with aiohttp.ClientSession() as session:
        try:
            engines = await start_engines(started, session, duration, source)
            port = free_port()
            argv = [sys.executable, "-m", "exporter", "--listen", f"127.0.0.1:{port}", "--gpu", f"fake:{gpus}",
                    "--interval", str(interval), "--node-name", "demo-node"]
            for e in engines:
                argv += ["--engine", e]
            exporter = started.spawn(argv, "exporter.log")
            base = f"http://127.0.0.1:{port}"
            if not await wait_http(session, f"{base}/readyz", exporter):
                log = (LOG_DIR / "exporter.log").read_text(errors="replace")[-2000:]
                print(f"the exporter did not become ready within {READY_TIMEOUT_S:.0f}s; its log ends:\n{log}", file=sys.stderr)
                return 1
            print(f"exporter: {base}/metrics  (fake GPUs: {gpus}; Ctrl-C to stop)\n")
            await watch(session, f"{base}/metrics", stop, duration, interval)
        finally:
            await started.stop()
    print("demo stopped; everything it started has exited.")
    return 0


async def watch(session: aiohttp.ClientSession, url: str, stop: asyncio.Event, duration: float | None, interval: float) -> None:
    start = time.monotonic()
    before: dict = {}
    while not stop.is_set() and (duration is None or time.monotonic() - start < duration):
        with suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                now = promtext.parse(await resp.text())
            elapsed = time.monotonic() - start
            print(f"t={elapsed:5.1f}s  {summary.targets_line(now)}  {summary.gpu_line(now)}")
            for line in summary.render_table(summary.model_rows(now, before)):
                print(line)
            print(flush=True)
            before = now
        remaining = interval * 2
        if duration is not None:
            remaining = min(remaining, max(0.0, duration - (time.monotonic() - start)))
        with suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), remaining)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo", description="The exporter with fake GPUs, scraping an engine, summarised live.")
    p.add_argument("--duration", type=float, default=None, metavar="SECONDS", help="stop after this long (default: until Ctrl-C)")
    p.add_argument("--gpus", type=int, default=4, help="fake GPUs (default 4)")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="exporter collection interval (default 1)")
    p.add_argument("--engines", choices=("auto", "simulator", "builtin"), default="auto",
                   help="auto (default): the simulator when installed, else built-in pages")
    args = p.parse_args(argv)
    return asyncio.run(run(args.duration, args.gpus, args.interval, args.engines))
