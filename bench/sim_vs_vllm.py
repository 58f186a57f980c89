"""The simulator's V1 scheduling against the real vLLM scheduler: one seeded arrival trace through both.

`python -m bench.sim_vs_vllm` starts the real vLLM (CPU build, the tiny random-weight Llama of
realengine/build_model.py, one OpenMP thread) with a small KV cache, replays the trace against it as an open-loop
streaming client, replays the same requests through the simulator in virtual time with the `tiny-llama-cpu` preset
and the same KV geometry, `max_num_seqs` and `max_num_batched_tokens`, and prints the comparison table that
docs/simulator.md carries (`--write-docs` rewrites it there). `--calibrate` measures the engine's step times
(engine-side, from vLLM's own histograms) and prints the fitted preset constants instead.

What is compared: queue depth (`vllm:num_requests_waiting`: polled every 50 ms on the real engine, integrated over
the steps in the simulator, both over the span from the first arrival to the last finish), preemptions
(`vllm:num_preemptions_total`), and TTFT and TPOT percentiles as the client sees them (TPOT as vLLM's benchmark
defines it: (E2E - TTFT) / (output tokens - 1)).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import statistics
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "simulator.md"
WORDS = 4000  # the tiny model's vocabulary has w0 .. w4088; a prompt of N words is N tokens


@dataclass(frozen=True)
class Geometry:
    """The engine settings both sides run with."""

    num_blocks: int = 40
    block_size: int = 32
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    max_model_len: int = 1024


@dataclass(frozen=True)
class TraceSpec:
    seed: int = 7
    num_requests: int = 120
    rate: float = 6.0  # Poisson arrivals per second
    prompt_median: float = 220
    prompt_range: tuple[int, int] = (32, 600)
    output_median: float = 140
    output_range: tuple[int, int] = (16, 380)
    sigma: float = 0.5


FULL = TraceSpec()
SHORT = TraceSpec(seed=11, num_requests=45, rate=6.0)


@dataclass(frozen=True)
class Item:
    arrival: float
    prompt: tuple[int, ...]  # word ids
    output_len: int


def trace(spec: TraceSpec) -> list[Item]:
    """Seeded Poisson arrivals; lognormal prompt and output lengths, clamped; prompts of random words (so no two
    requests share a cached block)."""
    rng = random.Random(spec.seed)
    t, items = 0.0, []
    for _ in range(spec.num_requests):
        t += rng.expovariate(spec.rate)
        p = min(spec.prompt_range[1], max(spec.prompt_range[0], round(rng.lognormvariate(math.log(spec.prompt_median), spec.sigma))))
        o = min(spec.output_range[1], max(spec.output_range[0], round(rng.lognormvariate(math.log(spec.output_median), spec.sigma))))
        items.append(Item(t, tuple(rng.randrange(WORDS) for _ in range(p)), o))
    return items


@dataclass
class Result:
    ttft: list[float]
    tpot: list[float]
    queue_avg: float
    queue_max: int
    preemptions: int
    failed: int = 0
    extra: dict = field(default_factory=dict)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


# ----------------------------------------------------------------------------- the simulator
def run_sim(items: list[Item], geo: Geometry, preset: str = "tiny-llama-cpu", slowdown: float = 1.0) -> Result:
    """The trace in virtual time. `slowdown` multiplies every step (the simulator's slowdown fault): the CPU
    contention the real run was measured under, from the probe (`contention`)."""
    from simulator.clock import VirtualClock
    from simulator.config import EngineConfig
    from simulator.engine import EngineCore, run_virtual
    from simulator.faults import FaultState
    from simulator.presets import get_deployment

    config = EngineConfig(deployment=get_deployment(preset), block_size=geo.block_size,
                          max_num_seqs=geo.max_num_seqs, max_num_batched_tokens=geo.max_num_batched_tokens,
                          max_model_len=geo.max_model_len, num_gpu_blocks_override=geo.num_blocks)
    clock = VirtualClock()
    core = EngineCore(config, clock, faults=FaultState(slowdown=slowdown))
    area = [0.0, 0.0, 0]  # integral of waiting over time, last change time, max

    class Watch:
        def __init__(self) -> None:
            self.waiting = 0

        def on_step(self, core, stats) -> None:
            # the gauge as vLLM sets it: after each step, from the scheduler's queue
            now = stats.now
            area[0] += self.waiting * (now - area[1])
            area[1] = now
            self.waiting = len(core.scheduler.waiting)
            area[2] = max(area[2], self.waiting)

        def on_finished(self, req) -> None:
            pass

    core.observers.append(Watch())
    reqs = []
    for it in items:
        req = core.new_request(list(it.prompt), it.output_len, ignore_eos=True)
        reqs.append((it.arrival, req))
    run_virtual(core, clock, reqs)
    first = items[0].arrival
    last = max(r.finished_time for _, r in reqs)
    ttft = [r.first_token_time - r.arrival_time for _, r in reqs]
    tpot = [(r.finished_time - r.first_token_time) / (r.num_output_tokens - 1) for _, r in reqs if r.num_output_tokens > 1]
    return Result(ttft, tpot, area[0] / (last - first), area[2], core.scheduler.num_preemptions,
                  extra={"span_s": last - first})


# ----------------------------------------------------------------------------- the real engine
def scrape(url: str) -> dict[str, float]:
    """vLLM's page, label sets summed per family sample name (one engine, one model)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(vllm:[a-z_]+)(?:\{[^}]*\})? (\S+)$", line)
        if m and "_bucket" not in m.group(1):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


async def _stream(session, url: str, words: tuple[int, ...], max_tokens: int) -> tuple[float, float, int]:
    """One streamed completion: (TTFT, E2E, output tokens) as the client sees them."""
    from realengine.vllm_server import SERVED_NAME
    from simulator.loadgen import sse_events

    body = {"model": SERVED_NAME, "prompt": " ".join(f"w{w}" for w in words), "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    ttft, n = None, 0
    async with session.post(url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for event in sse_events(resp):
            if event is None:
                break
            if ttft is None and any(c.get("text") for c in event.get("choices") or ()):
                ttft = time.perf_counter() - sent
            if event.get("usage"):
                n = event["usage"]["completion_tokens"]
    return ttft if ttft is not None else float("nan"), time.perf_counter() - sent, n


async def _replay(url: str, items: list[Item], poll_s: float = 0.05) -> Result:
    import aiohttp

    before = await asyncio.to_thread(scrape, url)
    samples: list[tuple[float, float]] = []
    done = asyncio.Event()

    async def poll(t0: float) -> None:
        while not done.is_set():
            page = await asyncio.to_thread(scrape, url)
            samples.append((time.perf_counter() - t0, page.get("vllm:num_requests_waiting", 0.0)))
            await asyncio.sleep(poll_s)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=900)) as session:
        t0 = time.perf_counter()
        poller = asyncio.create_task(poll(t0))
        ends: list[float] = []

        async def launch(it: Item):
            delay = it.arrival - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                out = await _stream(session, url, it.prompt, it.output_len)
            except Exception as e:  # noqa: BLE001 - counted as failed, reported
                return None, repr(e)
            ends.append(time.perf_counter() - t0)
            return out, ""

        results = await asyncio.gather(*(launch(it) for it in items))
        done.set()
        await poller
    after = await asyncio.to_thread(scrape, url)
    first, last = items[0].arrival, max(ends)
    window = [w for t, w in samples if first <= t <= last]
    good = [(r, it) for (r, _), it in zip(results, items, strict=True) if r is not None and r[2] == it.output_len]
    ttft = [r[0] for r, _ in good]
    tpot = [(r[1] - r[0]) / (r[2] - 1) for r, _ in good if r[2] > 1]
    return Result(ttft, tpot, statistics.fmean(window) if window else 0.0, int(max(window, default=0)),
                  int(after.get("vllm:num_preemptions_total", 0) - before.get("vllm:num_preemptions_total", 0)),
                  failed=len(items) - len(good), extra={"span_s": last - first, "polls": len(window)})


PROBE = [Item(0.0, tuple(range(i * 200, i * 200 + 128)), 48) for i in range(4)]


async def _probe(url: str) -> float:
    """The engine's mean inter-token latency (engine-side, vLLM's histogram) over 4 concurrent requests of 128
    prompt and 48 output tokens: how fast the engine steps on this machine right now."""
    import aiohttp

    a = await asyncio.to_thread(scrape, url)
    async with aiohttp.ClientSession() as s:
        rng = random.Random(time.perf_counter_ns())
        await asyncio.gather(*(_stream(s, url, tuple(rng.randrange(WORDS) for _ in it.prompt), it.output_len)
                               for it in PROBE))
    b = await asyncio.to_thread(scrape, url)
    k = "vllm:inter_token_latency_seconds"
    return (b[k + "_sum"] - a[k + "_sum"]) / (b[k + "_count"] - a[k + "_count"])


def contention(real: Result, geo: Geometry) -> float:
    """How much slower the engine stepped than the preset: the lower of the probes before and after the replay
    (a probe hit by another process's burst reads several times higher) over the simulator's probe."""
    return min(real.extra["probe_itl_s"]) / probe_sim(geo)


def probe_sim(geo: Geometry) -> float:
    """The same probe in the simulator: its mean inter-token latency."""
    r = run_sim(PROBE, geo)
    return statistics.fmean(r.tpot)


def start_engine(geo: Geometry, log_path: Path | None = None):
    from realengine.vllm_server import VllmConfig, VllmServer

    return VllmServer(VllmConfig(num_blocks=geo.num_blocks, block_size=geo.block_size, max_num_seqs=geo.max_num_seqs,
                                 max_num_batched_tokens=geo.max_num_batched_tokens, max_model_len=geo.max_model_len,
                                 prefix_caching=True, threads=1), log_path=log_path).start()


def run_real(items: list[Item], geo: Geometry, log_path: Path | None = None, server=None) -> Result:
    own = server is None
    server = server or start_engine(geo, log_path)
    try:
        # one small request first: the first one after start pays one-time costs
        asyncio.run(_warm(server.url))
        probes = [asyncio.run(_probe(server.url))]
        result = asyncio.run(_replay(server.url, items))
        probes.append(asyncio.run(_probe(server.url)))
        result.extra["probe_itl_s"] = probes
        return result
    finally:
        if own:
            server.stop()


async def _warm(url: str) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        await _stream(s, url, (1, 2, 3, 4), 4)


# ----------------------------------------------------------------------------- comparison
ROWS = (
    ("queue depth, time-averaged", lambda r: r.queue_avg, "{:.2f}"),
    ("queue depth, max", lambda r: r.queue_max, "{:.0f}"),
    ("preemptions", lambda r: r.preemptions, "{:.0f}"),
    ("TTFT p50 (ms)", lambda r: pct(r.ttft, 50) * 1e3, "{:.0f}"),
    ("TTFT p90 (ms)", lambda r: pct(r.ttft, 90) * 1e3, "{:.0f}"),
    ("TTFT p99 (ms)", lambda r: pct(r.ttft, 99) * 1e3, "{:.0f}"),
    ("TPOT p50 (ms)", lambda r: pct(r.tpot, 50) * 1e3, "{:.2f}"),
    ("TPOT p90 (ms)", lambda r: pct(r.tpot, 90) * 1e3, "{:.2f}"),
    ("TPOT p99 (ms)", lambda r: pct(r.tpot, 99) * 1e3, "{:.2f}"),
    ("span, first arrival to last finish (s)", lambda r: r.extra["span_s"], "{:.1f}"),
)


def ratios(real: Result, sim: Result) -> dict[str, float]:
    return {name: (f(sim) / f(real) if f(real) else (1.0 if f(sim) == 0 else math.inf)) for name, f, _ in ROWS}


def table(real: Result, sim: Result, before: Result | None = None) -> str:
    head = ("| metric | vLLM 0.32 (CPU) | simulator, contention applied | sim / vLLM |"
            + (" simulator, preset as fitted | that / vLLM |" if before else ""))
    lines = [head, "|---|---|---|---|" + ("---|---|" if before else "")]
    for name, f, fmt in ROWS:
        rv, sv = f(real), f(sim)
        ratio = f"{sv / rv:.2f}" if rv else ("=" if sv == 0 else "inf")
        row = f"| {name} | {fmt.format(rv)} | {fmt.format(sv)} | {ratio} |"
        if before:
            bv = f(before)
            row += f" {fmt.format(bv)} | {f'{bv / rv:.2f}' if rv else '-'} |"
        lines.append(row)
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- calibration
async def _calibrate(url: str, reps: int) -> dict:
    """Engine-side step times from vLLM's own histograms: a lone request's prefill time (scheduled to first
    token: one step when the prompt fits the budget) per prompt length, and the mean inter-token latency of
    B concurrent decoding requests per batch size and context; and the client's TTFT less the engine's."""
    import aiohttp

    rng = random.Random(3)
    prompt = lambda n: tuple(rng.randrange(WORDS) for _ in range(n))  # noqa: E731
    out: dict = {"prefill": {}, "decode": {}, "frontend": []}
    async with aiohttp.ClientSession() as s:
        await _stream(s, url, prompt(8), 4)
        for _ in range(reps):
            for p in (1, 64, 128, 256, 384, 512):
                a = scrape(url)
                ttft, _, _ = await _stream(s, url, prompt(p), 1)
                b = scrape(url)
                eng = b["vllm:request_prefill_time_seconds_sum"] - a.get("vllm:request_prefill_time_seconds_sum", 0)
                q = b["vllm:request_queue_time_seconds_sum"] - a.get("vllm:request_queue_time_seconds_sum", 0)
                out["prefill"].setdefault(p, []).append(eng)
                out["frontend"].append(ttft - eng - q)
            for ctx in (16, 400):
                for batch in (1, 2, 4, 8, 16):
                    a = scrape(url)
                    await asyncio.gather(*(_stream(s, url, prompt(ctx), 48) for _ in range(batch)))
                    b = scrape(url)
                    d = {k: b[k] - a.get(k, 0) for k in ("vllm:inter_token_latency_seconds_sum",
                                                         "vllm:inter_token_latency_seconds_count")}
                    out["decode"].setdefault(f"{batch}@{ctx}", []).append(
                        d["vllm:inter_token_latency_seconds_sum"] / d["vllm:inter_token_latency_seconds_count"])
    return out


def calibrate(reps: int = 3) -> dict:
    geo = Geometry(num_blocks=512, max_num_seqs=16, max_num_batched_tokens=2048, max_model_len=1024)
    server = start_engine(geo)
    try:
        raw = asyncio.run(_calibrate(server.url, reps))
    finally:
        server.stop()
    med = {"prefill": {p: statistics.median(v) for p, v in raw["prefill"].items()},
           "decode": {k: statistics.median(v) for k, v in raw["decode"].items()},
           "frontend": statistics.median(raw["frontend"])}
    return {"raw": raw, "median": med}


def load_line() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


def write_docs(text: str) -> None:
    doc = DOC.read_text()
    start, end = "<!-- sim-vs-vllm table: python -m bench.sim_vs_vllm --write-docs -->", "<!-- end of sim-vs-vllm table -->"
    i, j = doc.index(start) + len(start), doc.index(end)
    DOC.write_text(doc[:i] + "\n" + text + doc[j:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calibrate", action="store_true", help="measure the engine's step times and print them")
    p.add_argument("--short", action="store_true", help="the test's shorter trace")
    p.add_argument("--write-docs", action="store_true", help="rewrite the table in docs/simulator.md")
    p.add_argument("--sim-only", action="store_true", help="the simulator's side only (no real engine)")
    p.add_argument("--slowdown", type=float, default=0.0, help="with --sim-only: the contention factor to apply")
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if a.calibrate:
        print(json.dumps(calibrate(), indent=1))
        return 0
    geo, items = Geometry(), trace(SHORT if a.short else FULL)
    sim = run_sim(items, geo)
    if a.sim_only and a.slowdown:
        sim = run_sim(items, geo, slowdown=a.slowdown)
    if a.sim_only:
        print(json.dumps({n: f(sim) for n, f, _ in ROWS}, indent=1))
        return 0
    load0 = load_line()
    real = run_real(items, geo)
    load1 = load_line()
    factor = contention(real, geo)
    contended = run_sim(items, geo, slowdown=factor)
    text = table(real, contended, sim)
    note = (f"\nTrace: {len(items)} requests, seed {(SHORT if a.short else FULL).seed}; KV {geo.num_blocks} blocks x "
            f"{geo.block_size} tokens, max_num_seqs {geo.max_num_seqs}, max_num_batched_tokens "
            f"{geo.max_num_batched_tokens}. Real engine: {real.failed} failed requests, {real.extra['polls']} polls. "
            f"Load average before / after: {load0.split()[:3]} / {load1.split()[:3]}. Contention factor "
            f"{factor:.2f} (probe ITL {', '.join(f'{x * 1e3:.2f}' for x in real.extra['probe_itl_s'])} ms before / "
            f"after, the preset's {probe_sim(geo) * 1e3:.2f} ms).\n")
    print(text + note)
    if a.write_docs:
        write_docs(text + note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
