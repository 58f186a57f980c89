"""`--workers 2 --admission` in front of the simulator (real processes, real time): each worker's gate admits on
its own, so each counts its admissions (and its requests in flight) for both; together they admit a burst as
one process would, not twice it, and below capacity nothing is refused."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import aiohttp

from bench.bench_tap_admission import _spawn as spawn_logged
from bench.bench_tap_admission import _stop, refusal_reasons
from simulator.loadgen import send_one
from simulator.stats import RequestRecord
from simulator.workload import LengthDist, WorkItem, WorkloadSpec, generate
from tests.tap.test_workers import _spawn

ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama-3-8b-instruct"  # slos/chat.yaml's interactive class: TTFT <= 0.5 s, TPOT <= 0.05 s
KV_BLOCKS = 600  # 599 usable blocks of 16 tokens: 23 prompts of 400 tokens (25 blocks each) start at once
PROMPT, OUTPUT = LengthDist(400, 0.0, 400, 400), LengthDist(100, 0.0, 100, 100)
STEADY_RATE, STEADY_S = 2.0, 8.0  # about a quarter of this engine's capacity (7.5 req/s, bench/bench_tap_admission.py)
BURST = 64
STARTS_AT_ONCE = 23  # prompts of the burst the free KV starts at once (599 usable blocks / 25 blocks a prompt)


def _items(rate: float, duration: float, seed: int) -> list[WorkItem]:
    return generate(WorkloadSpec(rate=rate, duration=duration, prompt_len=PROMPT, output_len=OUTPUT, seed=seed), 8192)


async def _send(url: str, items: list[WorkItem]) -> list[RequestRecord]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:
        t0 = time.perf_counter()

        async def one(item: WorkItem) -> RequestRecord:
            await asyncio.sleep(max(0.0, item.arrival - (time.perf_counter() - t0)))
            return await send_one(session, url, item, MODEL, True, t0)

        return list(await asyncio.gather(*(one(i) for i in items)))


def _preemptions(engine: str) -> float:
    text = urllib.request.urlopen(engine + "/metrics", timeout=10).read().decode()
    return sum(float(v) for v in re.findall(r"^vllm:num_preemptions_total\{[^}]*\} (\S+)$", text, re.M))


def test_two_workers_admit_a_burst_as_one_gate_would_and_refuse_nothing_below_capacity() -> None:
    sim, m = spawn_logged(
        [sys.executable, "-m", "simulator.cli", "serve", "--host", "127.0.0.1", "--port", "0", "--preset",
         "llama3-8b-h100", "--model", MODEL, "--num-gpu-blocks", str(KV_BLOCKS), "--slowdown", "2", "--seed", "3"],
        r"on (http://\S+)", "the simulator")
    engine = m.group(1)
    tap, proxy, metrics, _ = _spawn(engine, 2, "--admission", "--slo", str(ROOT / "slos" / "chat.yaml"))
    try:
        time.sleep(1.0)  # the gates' first readings
        steady = asyncio.run(_send(proxy, _items(STEADY_RATE, STEADY_S, 5)))
        refused = [r for r in steady if "429" in r.error]
        assert steady and not refused, f"{len(refused)} of {len(steady)} refused below capacity: {refusal_reasons(metrics)}"
        assert all(r.ok for r in steady), [r.error for r in steady if not r.ok]
        before = _preemptions(engine)
        burst = asyncio.run(_send(proxy, [replace(i, arrival=0.0) for i in _items(100.0, 10.0, 6)[:BURST]]))
        admitted = [r for r in burst if "429" not in r.error]
        # waited for a running request to finish (one 100-token answer takes about 2.5 s on this engine)
        waited = [r for r in admitted if r.ttft is None or r.ttft > 2.0]
        shown = (f"admitted {len(admitted)} of {BURST}, {len(waited)} of them behind a finish, preemptions "
                 f"{_preemptions(engine) - before:g}, TTFTs {sorted(round(r.ttft or -1, 2) for r in admitted)}")
        # The engine starts 23 such prompts at once (599 blocks / 25); one gate admits those and the few that
        # start within the objective behind them (30 to 32 on a quiet machine; 40 once under `make test`'s load,
        # where the burst reached the gates over more than one reading). Two gates that each took the free KV as
        # theirs admit those 23 each, at least 46 (53 measured, 30 of them behind finishes, TTFT 3 to 7 s).
        assert 12 <= len(admitted) < 2 * STARTS_AT_ONCE, shown
        assert len(waited) <= len(admitted) // 2, shown  # a CPU-starved simulator runs slower than planned
    finally:
        tap.send_signal(signal.SIGTERM)
        tap.communicate(timeout=30)
        _stop(sim)
