"""A full collection cycle of a large GPU node: our exporter against the naive prometheus_client re-exposer.

The node: 8 GPUs through the fake provider and 8 vLLM engines, each page carrying 64 LoRA adapters (made at
run time by the simulator's vLLM metrics, `bench/lora_pages.py`), served over loopback HTTP by an aiohttp
server in its own process (`bench/page_server.py`). Each exporter runs in its own process
(`bench/collection_worker.py`), so CPU time (`time.process_time`, every thread) and RSS (/proc) are its own.
Cycles run back to back through the collector API, ours and the peer's in interleaved rounds; each keeps its
best round. Growth: the same at 1, 4 and 8 engines (64 adapters) and 4, 16 and 64 adapters (8 engines).
Memory over time: a soak of 10,000 cycles (one engine and one GPU, see SOAK_*), with RSS read at cycles 100,
1,000, 5,000 and 10,000.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.cycle_protocol import CycleWorker, close_stdin_process
from bench.lora_pages import vllm_lora_page
from bench.report import Row

ROOT = Path(__file__).resolve().parent.parent
CYCLE = "Collection cycle: 8 GPUs, 8 vLLM engines x 64 LoRA adapters"
GROWTH = "Collection cycle: growth with engines and adapters"
COMMAND = "python -m bench collection"

GPUS = "fake:8"
NODE_ENGINES, NODE_ADAPTERS = 8, 64
ENGINE_SIZES = (1, 4, 8)  # at NODE_ADAPTERS adapters each
ADAPTER_SIZES = (4, 16, 64)  # at NODE_ENGINES engines
ROUNDS = 4
ROUND_SECONDS = 0.2  # each side's round runs about this long (at least one cycle)
WARMUP_CYCLES = 2  # connections, detection and label caches: what every cycle after the first reuses

# The soak: 10,000 cycles of the whole node take 5 to 6 minutes of CPU (30 to 35 ms each), beyond this module's
# budget of about 2.5 minutes, so it runs the same cycle (HTTP, parse, adapt, guard, GPU thread, render, gzip) for
# one engine with its 64 adapters and one GPU: every code path, 10,000 times, in about 90 s. The peer soaks to
# 1,000 alongside.
SOAK_ENGINES = 1
SOAK_GPUS = "fake:1"
SOAK_CHECKPOINTS = (100, 1_000, 5_000, 10_000)  # 5,000: a plateau shows as no change in the second half
PEER_SOAK_CHECKPOINTS = (100, 1_000)

NOTES = {
    CYCLE: (
        "One collection cycle of a large node, cycles back to back (no interval sleep). 8 GPUs through the fake "
        "provider; 8 vLLM V1 engines whose pages come from the simulator's vLLM metrics (vLLM 0.33's families, "
        "labels and buckets, after 30 simulated seconds of mixed traffic, then one long request per adapter so "
        "the newest `lora_requests_info` series names all 64 adapters, comma-separated, running and waiting; the "
        "earlier label sets stay on the page, as in vLLM), served gzipped over loopback HTTP by an aiohttp server "
        "in its own process. *Ours*: `CollectionLoop.run_once` (scrape all targets at once, parse the wanted "
        "families, adapt, cap, GPUs, render and gzip once). *Peer*: the naive way, fetching with the same client, "
        "parsing every page with prometheus_client's `text_string_to_metric_families`, renaming each family into "
        "`llm_` with identity labels in a custom collector and `generate_latest` (gzipped, as prometheus_client "
        "answers Prometheus). Each in its own process: CPU is `time.process_time` (all threads), RSS from "
        "/proc/self/status; interleaved rounds, best round each. The soak runs the same cycle for one engine (64 "
        "adapters) and one GPU, every code path 10,000 times: 10,000 whole-node cycles (30 to 35 ms of CPU each) "
        "would take 5 to 6 minutes, beyond the benchmark's time budget. The peer soaks to cycle 1,000 alongside."
    ),
    GROWTH: (
        "The same cycle at 1, 4 and 8 engines (64 adapters each) and at 4, 16 and 64 adapters per engine "
        "(8 engines), with the 8 fake GPUs throughout. Output series include the GPUs' and the self-metrics. "
        "The last two rows state the growth measured across the three sizes."
    ),
}


@dataclass(frozen=True)
class Measured:
    """Best-round figures of one exporter on one node shape."""

    cpu_s: float  # per cycle
    wall_s: float  # per cycle
    series: int
    body_bytes: int
    peak_rss_kib: int


@contextlib.contextmanager
def page_server(directory: Path):
    proc = subprocess.Popen([sys.executable, "-m", "bench.page_server", str(directory)],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None  # stdout=PIPE
        port = proc.stdout.readline().strip()
        if not port:
            raise RuntimeError(f"page server exited with {proc.wait()}")
        yield f"http://127.0.0.1:{port}"
    finally:
        close_stdin_process(proc)


@contextlib.contextmanager
def workers(*specs: tuple[str, list[str]], workdir: Path, gpus: str = GPUS):
    started: list[CycleWorker] = []
    try:
        for mode, urls in specs:
            started.append(CycleWorker("bench.collection_worker", mode, {"urls": urls, "gpu": gpus, "node": "bench-node"},
                                       workdir))
        yield started
    finally:
        for w in started:
            w.close()


def page_name(adapters: int, engine: int) -> str:
    return f"a{adapters}-e{engine}"


def node_urls(base: str, engines: int, adapters: int) -> list[str]:
    return [f"{base}/{page_name(adapters, i)}" for i in range(engines)]


def cycles_per_round(warmup: dict) -> int:
    per_cycle = warmup["cpu_s"] / warmup["cycles"]
    return max(1, min(50, round(ROUND_SECONDS / max(per_cycle, 1e-6))))


def measure_interleaved(ours: CycleWorker, peer: CycleWorker) -> tuple[Measured, Measured]:
    """Warm both up, then ROUNDS alternating rounds; per-cycle CPU and wall from each side's best round."""
    sizes = {w: cycles_per_round(w.run(WARMUP_CYCLES)) for w in (ours, peer)}
    best = {w: {"cpu_s": float("inf"), "wall_s": float("inf")} for w in (ours, peer)}
    last: dict[CycleWorker, dict] = {}
    for _ in range(ROUNDS):
        for w in (ours, peer):
            r = last[w] = w.run(sizes[w])
            for key in ("cpu_s", "wall_s"):
                best[w][key] = min(best[w][key], r[key] / r["cycles"])

    def measured(w: CycleWorker) -> Measured:
        return Measured(best[w]["cpu_s"], best[w]["wall_s"], last[w]["series"], last[w]["bytes"], last[w]["peak_rss_kib"])

    return measured(ours), measured(peer)


def soak(base: str, workdir: Path) -> tuple[dict[int, int], dict[int, int]]:
    """RSS (KiB) at each checkpoint: ours and the peer run side by side, one process each."""
    urls = node_urls(base, SOAK_ENGINES, NODE_ADAPTERS)
    rss: dict[str, dict[int, int]] = {"ours": {}, "peer": {}}
    with workers(("ours", urls), ("peer", urls), workdir=workdir, gpus=SOAK_GPUS) as (ours, peer):
        plan = {"ours": (ours, SOAK_CHECKPOINTS), "peer": (peer, PEER_SOAK_CHECKPOINTS)}
        for step in range(len(SOAK_CHECKPOINTS)):
            running = []
            for name, (w, checkpoints) in plan.items():
                if step < len(checkpoints):
                    w.start(checkpoints[step] - w.cycles_done)
                    running.append((name, w, checkpoints[step]))
            for name, w, checkpoint in running:
                rss[name][checkpoint] = w.result()["rss_kib"]
    return rss["ours"], rss["peer"]


# ------------------------------------------------------------------------------------------ formatting
def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def mib(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB"


def less(ours: float, peer: float) -> str:
    """A cost ratio read as words: how many times less (or more) ours costs than the peer's."""
    if not ours or not peer:
        return "n/a"
    ratio, word = (peer / ours, "less") if ours <= peer else (ours / peer, "more")
    return f"{ratio:.2f}x {word}" if ratio < 1.5 else f"{ratio:.1f}x {word}"


def growth(label: str, unit: str, sizes: tuple[int, ...], ours: list[Measured], peer: list[Measured]) -> Row:
    def describe(ms_list: list[Measured]) -> str:
        cpu = " -> ".join(f"{m.cpu_s * 1000:.1f}" for m in ms_list)
        series = " -> ".join(f"{m.series:,}" for m in ms_list)
        slope = (ms_list[-1].cpu_s - ms_list[0].cpu_s) / (sizes[-1] - sizes[0]) * 1000
        return f"CPU {cpu} ms/cycle ({slope:+.2f} ms {unit}); series {series}"

    factor = sizes[-1] / sizes[0]
    ours_x, peer_x = ours[-1].cpu_s / ours[0].cpu_s, peer[-1].cpu_s / peer[0].cpu_s
    return Row(
        GROWTH,
        f"growth with {label} {' -> '.join(map(str, sizes))} (x{factor:g})",
        describe(ours), describe(peer),
        f"CPU x{ours_x:.1f} (ours) vs x{peer_x:.1f} (peer)", COMMAND,
    )


# ------------------------------------------------------------------------------------------ run
def run() -> list[Row]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-collection-") as tmp:
        workdir = Path(tmp)
        page_bytes: dict[int, int] = {}
        for adapters in ADAPTER_SIZES:
            for i in range(NODE_ENGINES):
                text = vllm_lora_page(adapters, seed=i)
                (workdir / f"{page_name(adapters, i)}.prom").write_text(text)
                page_bytes[adapters] = page_bytes.get(adapters, 0) + len(text.encode())
        progress("pages generated", started)
        with page_server(workdir) as base:
            shapes = sorted({(e, NODE_ADAPTERS) for e in ENGINE_SIZES} | {(NODE_ENGINES, a) for a in ADAPTER_SIZES})
            results: dict[tuple[int, int], tuple[Measured, Measured]] = {}
            for engines, adapters in shapes:
                urls = node_urls(base, engines, adapters)
                with workers(("ours", urls), ("peer", urls), workdir=workdir) as (ours, peer):
                    results[(engines, adapters)] = measure_interleaved(ours, peer)
            progress("cycles measured", started)
            soak_ours, soak_peer = soak(base, workdir)
            progress("soak done", started)
    return cycle_rows(results[(NODE_ENGINES, NODE_ADAPTERS)], page_bytes[NODE_ADAPTERS], soak_ours, soak_peer) + \
        growth_rows(results)


def progress(what: str, since: float) -> None:
    print(f"  collection: {what} ({time.monotonic() - since:.0f} s)", file=sys.stderr, flush=True)


def cycle_rows(node: tuple[Measured, Measured], node_page_bytes: int, soak_ours: dict[int, int],
               soak_peer: dict[int, int]) -> list[Row]:
    ours, peer = node
    pages = f"{NODE_ENGINES} pages, {node_page_bytes / 1e6:.2f} MB in all"
    soak_what = (f"RSS at cycle {' / '.join(f'{n:,}' for n in SOAK_CHECKPOINTS)} (soak: {SOAK_ENGINES} engine x "
                 f"{NODE_ADAPTERS} adapters + {SOAK_GPUS.removeprefix('fake:')} GPU, HTTP)")
    last_ours, last_peer = SOAK_CHECKPOINTS[-1], PEER_SOAK_CHECKPOINTS[-1]
    halfway = SOAK_CHECKPOINTS[-2]
    drift = soak_ours[last_ours] - soak_ours[halfway]
    return [
        Row(CYCLE, f"CPU time per cycle ({pages}; process_time, all threads)", ms(ours.cpu_s), ms(peer.cpu_s),
            less(ours.cpu_s, peer.cpu_s), COMMAND),
        Row(CYCLE, "wall time per cycle (cycles back to back)", ms(ours.wall_s), ms(peer.wall_s),
            less(ours.wall_s, peer.wall_s), COMMAND),
        Row(CYCLE, "peak RSS (VmHWM) after the measured cycles", mib(ours.peak_rss_kib), mib(peer.peak_rss_kib),
            less(ours.peak_rss_kib, peer.peak_rss_kib), COMMAND),
        Row(CYCLE, "output per cycle (series, uncompressed bytes)",
            f"{ours.series:,} series, {ours.body_bytes / 1e3:,.0f} kB",
            f"{peer.series:,} series, {peer.body_bytes / 1e3:,.0f} kB", less(ours.series, peer.series), COMMAND),
        Row(CYCLE, soak_what,
            " / ".join(mib(soak_ours[n]) for n in SOAK_CHECKPOINTS)
            + f" ({drift / 1024:+.2f} MiB from cycle {halfway:,} to {last_ours:,})",
            " / ".join(mib(soak_peer[n]) for n in PEER_SOAK_CHECKPOINTS) + f" (to cycle {last_peer:,})",
            f"{less(soak_ours[last_peer], soak_peer[last_peer])} at cycle {last_peer:,}", COMMAND),
    ]


def growth_rows(results: dict[tuple[int, int], tuple[Measured, Measured]]) -> list[Row]:
    rows = []
    for (engines, adapters), (ours, peer) in sorted(results.items()):
        rows.append(Row(
            GROWTH, f"{engines} engine{'s' if engines != 1 else ''} x {adapters} adapters: CPU per cycle, output series",
            f"{ms(ours.cpu_s)}, {ours.series:,} series", f"{ms(peer.cpu_s)}, {peer.series:,} series",
            less(ours.cpu_s, peer.cpu_s), COMMAND,
        ))
    by_engines = [results[(e, NODE_ADAPTERS)] for e in ENGINE_SIZES]
    by_adapters = [results[(NODE_ENGINES, a)] for a in ADAPTER_SIZES]
    rows.append(growth(f"engines ({NODE_ADAPTERS} adapters each)", "per engine", ENGINE_SIZES,
                       [o for o, _ in by_engines], [p for _, p in by_engines]))
    rows.append(growth(f"adapters per engine ({NODE_ENGINES} engines)", f"per adapter on each of {NODE_ENGINES} engines",
                       ADAPTER_SIZES, [o for o, _ in by_adapters], [p for _, p in by_adapters]))
    return rows
