"""A hostile engine page: one collection cycle of a vLLM page flooded with 250,000 junk series, this tree vs OLD_COMMIT
(as BEFORE records it: that tree is not run again).

The page: the simulator's vLLM page with 64 LoRA adapters (`bench/lora_pages.py`), then 250,000 series of
`vllm:num_requests_running` with made-up model names right after the page's own series of that family (about
15 MB, under the 16 MiB page cap), as a runaway label would make them. Each exporter runs one cycle
(`CollectionLoop.run_once`: read the page from a file:// target, parse, adapt, guard, render and gzip) in a
process of its own (this file run as a script, with this tree first on sys.path), which reports
its CPU time (`time.process_time`, every thread), peak RSS (VmHWM) before and after the cycle, the longest
event-loop stall during the cycle (a task asking to wake every millisecond; a /metrics request would wait
that long), whether the target stayed up, and how many of the real model's normalized families survived.
The same is measured for the page without the junk, so the rows show what the junk itself costs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTION = "Hostile page: 250,000 junk series on a vLLM page"
COMMAND = "python -m bench hostile-page"
OLD_COMMIT = "9090d4d"  # the exporter before the hostile-page limits (in its parser, collector and guard)
JUNK_SERIES = 250_000
ADAPTERS = 64
RECORDED = "2026-12-01"  # when OLD_COMMIT's exporter last ran beside ours (BENCHMARKS.md, commit abf091b)


@dataclass(frozen=True)
class Before:
    """OLD_COMMIT's exporter on the same pages, as last measured beside ours (RECORDED)."""

    cpu_s: float = 6.79
    hwm_mib: int = 499
    stall_ms: float = 2268
    real_families: int = 1
    clean_families: int = 21
    series: int = 20_000
    clean_cpu_ms: float = 6.1
    clean_hwm_mib: int = 40
    clean_stall_ms: float = 2


BEFORE = Before()

NOTES = {
    SECTION: (
        f"One collection cycle of one vLLM target whose page is the simulator's vLLM page ({ADAPTERS} LoRA adapters) "
        f"with {JUNK_SERIES:,} series of `vllm:num_requests_running` added after the page's own, each with a made-up "
        "`model_name` (a runaway label). *Ours*: this tree (the parser reads at most `max_samples_per_family` = "
        "10,000 samples of a family and counts the rest unparsed; the guard keeps every family's first series "
        "before any family's second; parse, adapt and guard run in a worker thread; start-up objects are frozen out "
        "of the garbage collector's view, as `serve` does once started). *Peer*: the exporter at "
        f"{OLD_COMMIT}, same page, same defaults, as recorded {RECORDED} when it last ran beside ours (not run "
        "again). Each in a process of its own that runs "
        "`CollectionLoop.run_once` once on a file:// target: CPU is `time.process_time` (all threads), peak RSS "
        "is VmHWM after the cycle (the process's imports included; the clean page's row shows that baseline), the "
        "stall is the longest the event loop (which answers /metrics) was late for a 1 ms timer during the cycle."
    ),
}


# ------------------------------------------------------------------------------------------ the worker
def worker(tree: str, page: str, real_model: str) -> dict:
    """One cycle of the exporter in `tree` (this one) on the page at `page` (runs in its own process)."""
    sys.path.insert(0, tree)
    import asyncio
    import time

    import aiohttp

    from exporter.collector import Collector
    from exporter.config import ExporterConfig, TargetConfig
    from exporter.snapshot import CollectionLoop, SnapshotHolder
    from exporter.targets import TargetSet
    from llmslo import conventions as c

    def status_kib(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise KeyError(field)

    async def main() -> dict:
        targets = (TargetConfig("vllm", Path(page).as_uri(), name="engine"),)
        config = ExporterConfig(gpu="off", targets=targets, interval_s=5.0, node_name="bench")
        stall = 0.0
        running = True

        async def ticker() -> None:
            nonlocal stall
            while running:
                asked = time.perf_counter()
                await asyncio.sleep(0.001)
                stall = max(stall, time.perf_counter() - asked - 0.001)

        async with aiohttp.ClientSession() as session:
            collector = Collector(config, session, None, "bench")
            loop = CollectionLoop(collector, TargetSet(targets), SnapshotHolder(), config.interval_s)
            from exporter.cli import freeze_startup_objects

            freeze_startup_objects()  # what `serve` does once started
            hwm_before = status_kib("VmHWM")
            tick = asyncio.create_task(ticker())
            await asyncio.sleep(0.01)
            stall = 0.0
            cpu, wall = time.process_time(), time.perf_counter()
            published = await loop.run_once()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            running = False
            await tick
        snap = published.snapshot
        engine = [s for s in snap.samples if s.metric in c.ENGINE_METRICS]
        return {
            "cpu_s": cpu, "wall_s": wall, "stall_s": stall, "hwm_before_kib": hwm_before, "hwm_kib": status_kib("VmHWM"),
            "up": snap.targets[0].up, "reason": snap.targets[0].reason, "series": len(engine),
            "real_families": sorted({s.metric.name for s in engine if s.labels.get(c.LABEL_MODEL) == real_model}),
            "body_bytes": len(published.body),
        }

    return asyncio.run(main())


# ------------------------------------------------------------------------------------------ the run
def flooded(page: str, junk: int) -> str:
    marker = "vllm:num_requests_running{"
    at = page.index(marker)
    end = page.index("\n", at) + 1
    flood = "".join(f'vllm:num_requests_running{{engine="0",model_name="j-{i:06d}"}} 1\n' for i in range(junk))
    return page[:end] + flood + page[end:]


def measure(page: Path, real_model: str) -> dict:
    out = subprocess.run([sys.executable, __file__, str(ROOT), str(page), real_model], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def mib(kib: int) -> str:
    return f"{kib / 1024:.0f} MiB"


def before(text: str) -> str:
    """A peer cell: OLD_COMMIT's recorded figure, said to be one."""
    return f"{text} (before, {OLD_COMMIT}, recorded {RECORDED})"


def ratio(ours: float, peer: float) -> str:
    if not ours or not peer:
        return "n/a"
    return f"{peer / ours:.1f}x less" if ours <= peer else f"{ours / peer:.1f}x more"


def run() -> list:
    from bench.lora_pages import vllm_lora_page
    from bench.report import Row

    page = vllm_lora_page(ADAPTERS)
    real_model = page.split('vllm:num_requests_running{engine="0",model_name="', 1)[1].split('"', 1)[0]
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
        clean_path, flood_path = Path(tmp) / "clean.prom", Path(tmp) / "flood.prom"
        clean_path.write_text(page)
        flood_text = flooded(page, JUNK_SERIES)
        flood_path.write_text(flood_text)
        ours_clean, ours = measure(clean_path, real_model), measure(flood_path, real_model)
    size = f"{len(flood_text.encode()) / 1e6:.1f} MB"
    old = BEFORE
    families = f"{len(ours['real_families'])} of {len(ours_clean['real_families'])}, target_up {int(ours['up'])}"

    return [
        Row(SECTION, f"CPU time of the cycle ({size} page; process_time, all threads)",
            f"{ours['cpu_s']:.2f} s", before(f"{old.cpu_s:.2f} s"), ratio(ours["cpu_s"], old.cpu_s), COMMAND),
        Row(SECTION, "peak RSS (VmHWM) after the cycle",
            mib(ours["hwm_kib"]), before(f"{old.hwm_mib} MiB"), ratio(ours["hwm_kib"], old.hwm_mib * 1024), COMMAND),
        Row(SECTION, "longest event-loop stall during the cycle (how long /metrics would wait)",
            f"{ours['stall_s'] * 1000:.0f} ms", before(f"{old.stall_ms:.0f} ms"),
            ratio(ours["stall_s"] * 1000, old.stall_ms), COMMAND),
        Row(SECTION, "the real model's normalized families kept (of those on the clean page)",
            families, before(f"{old.real_families} of {old.clean_families}, target_up 1"),
            f"{len(ours['real_families'])} vs {old.real_families}", COMMAND),
        Row(SECTION, "engine series out (cap: max_series_per_target = 20,000)",
            f"{ours['series']:,}", before(f"{old.series:,}"), ratio(ours["series"], old.series), COMMAND),
        Row(SECTION, f"the same page without the junk ({len(page.encode()) / 1e3:.0f} kB): CPU, peak RSS, stall",
            f"{ours_clean['cpu_s'] * 1000:.1f} ms, {mib(ours_clean['hwm_kib'])}, {ours_clean['stall_s'] * 1000:.0f} ms",
            before(f"{old.clean_cpu_ms:.1f} ms, {old.clean_hwm_mib} MiB, {old.clean_stall_ms:.0f} ms"),
            ratio(ours_clean["cpu_s"] * 1000, old.clean_cpu_ms), COMMAND),
    ]


if __name__ == "__main__":
    print(json.dumps(worker(sys.argv[1], sys.argv[2], sys.argv[3])))
