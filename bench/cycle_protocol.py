"""The stdin protocol of the collection benchmarks' worker processes, both sides.

A worker process prints `{"ready": true}`, then answers each stdin line N (run N cycles back to back)
with one JSON line of its CPU and wall seconds and the last cycle's output; the driver writes N and
reads the answer. bench.collection_worker and bench.real_engine_cycle are such workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


async def serve(cycle: Callable[[], Awaitable[bytes]], report: Callable[[bytes], dict]) -> None:
    """The worker's side: `report(last body)` adds its fields to the CPU and wall figures."""
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(json.dumps({"ready": True}), flush=True)
    while line := (await reader.readline()).strip():
        cycles = int(line)
        cpu, wall = time.process_time(), time.perf_counter()
        body = b""
        for _ in range(cycles):
            body = await cycle()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(json.dumps({"cycles": cycles, "cpu_s": cpu, "wall_s": wall, **report(body)}), flush=True)


class CycleWorker:
    """The driver's side: one worker process (`python -m MODULE MODE SPEC.json`), N cycles at a time."""

    _ids = itertools.count()

    def __init__(self, module: str, mode: str, spec: dict, workdir: Path) -> None:
        path = workdir / f"{module.rsplit('.', 1)[-1]}-{next(self._ids)}-{mode}.json"
        path.write_text(json.dumps(spec))
        self.argv = [module, mode, str(path)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", *self.argv], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._expect_line()
        self.cycles_done = 0

    def _expect_line(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{' '.join(self.argv)} exited with {self.proc.wait()}")
        return json.loads(line)

    def start(self, cycles: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{cycles}\n")
        self.proc.stdin.flush()
        self.cycles_done += cycles

    def result(self) -> dict:
        return self._expect_line()

    def run(self, cycles: int) -> dict:
        self.start(cycles)
        return self.result()

    def close(self) -> None:
        close_stdin_process(self.proc)


def close_stdin_process(proc: subprocess.Popen) -> None:
    """Ends a process that runs until its stdin closes; killed if it has not within 10 s."""
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
