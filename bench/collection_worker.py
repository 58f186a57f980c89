"""`python -m bench.collection_worker ours|peer SPEC.json`: one node exporter, driven cycle by cycle from stdin.

Each stdin line is a number N: run N collection cycles back to back (no interval sleep) and answer one JSON
line with this process's CPU seconds (`time.process_time`: every thread, so parsing in worker threads and
NVML's thread count), wall seconds, current and peak RSS from /proc/self/status, and the last cycle's output
(series and bytes). The process holds nothing else, so its RSS is the exporter's.

* `ours`: the exporter's own path, `CollectionLoop.run_once` (scrape every target at once, parse the wanted
  families, adapt, guard, GPUs through the fake provider, render and gzip the page once).
* `peer`: the naive way with prometheus_client: fetch the same pages with the same client, parse every page
  with `text_string_to_metric_families`, rename each family into the `llm_` namespace with identity labels,
  yield them from a custom collector and `generate_latest` (gzipped, as prometheus_client answers a
  Prometheus scrape); the same fake GPUs' samples go through the same collector.

SPEC.json: {"urls": [...], "gpu": "fake:8", "node": "bench-node"}; `ours` also takes file:// URLs (the
exporter's saved-page source), for soaks whose HTTP cost would not fit the time budget.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from bench.cycle_protocol import serve
from exporter.config import ExporterConfig, TargetConfig
from exporter.gpu import collect_gpus, open_provider
from exporter.model import NormSample
from exporter.sources.http import new_session
from llmslo import conventions as c

ENGINE_PREFIX = c.VLLM.PREFIX
NAMESPACE = "llm"


def identity(index: int, node: str) -> dict[str, str]:
    """The labels both exporters put on engine `index`'s series (distinct pods, so no series collide)."""
    return {c.LABEL_ENGINE: "vllm", c.LABEL_POD: f"vllm-{index}", c.LABEL_NAMESPACE: NAMESPACE, c.LABEL_NODE: node}


def proc_status_kib(field: str) -> int:
    """A `kB` field of /proc/self/status (VmRSS: resident now; VmHWM: the peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def output_series(body: bytes) -> int:
    return sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))


# ------------------------------------------------------------------------------------------ ours
async def ours(spec: dict, session: aiohttp.ClientSession) -> Callable[[], Awaitable[bytes]]:
    from exporter.collector import Collector
    from exporter.snapshot import CollectionLoop, SnapshotHolder
    from exporter.targets import TargetSet

    targets = tuple(
        TargetConfig("vllm", url, name=f"engine-{i}", pod=ident[c.LABEL_POD], namespace=ident[c.LABEL_NAMESPACE])
        for i, url in enumerate(spec["urls"])
        for ident in [identity(i, spec["node"])]
    )
    config = ExporterConfig(gpu=spec["gpu"], targets=targets, interval_s=5.0, node_name=spec["node"])
    collector = Collector(config, session, open_provider(config.gpu), spec["node"])
    loop = CollectionLoop(collector, TargetSet(targets), SnapshotHolder(), config.interval_s)

    async def cycle() -> bytes:
        published = await loop.run_once()
        down = [f"{t.target}: {t.reason}" for t in published.snapshot.targets if not t.up]
        if down:  # a benchmark of failing scrapes would measure the wrong thing
            raise RuntimeError(f"targets down: {down}")
        return published.body

    return cycle


# ------------------------------------------------------------------------------------------ peer
class RenamedFamilies:
    """A prometheus_client custom collector yielding whatever the last cycle built."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def collect(self) -> list[Metric]:
        return self.families


def rename(name: str) -> str:
    return f"{c.PREFIX}{name.removeprefix(ENGINE_PREFIX)}"


def renamed_engine_families(text: str, labels: dict[str, str]) -> list[Metric]:
    out = []
    for fam in text_string_to_metric_families(text):
        new = Metric(rename(fam.name), fam.documentation, fam.type, fam.unit)
        for s in fam.samples:
            new.add_sample(rename(s.name), {**s.labels, **labels}, s.value, s.timestamp, s.exemplar)
        out.append(new)
    return out


def gpu_families(samples: list[NormSample]) -> list[Metric]:
    grouped: dict[str, list[NormSample]] = defaultdict(list)
    for s in samples:
        grouped[s.metric.name].append(s)
    out = []
    for name, members in grouped.items():
        fam = Metric(name, members[0].metric.help, members[0].metric.kind)
        for s in members:
            fam.add_sample(s.name, s.labels, s.value)
        out.append(fam)
    return out


async def peer(spec: dict, session: aiohttp.ClientSession) -> Callable[[], Awaitable[bytes]]:
    provider = open_provider(spec["gpu"])
    node = spec["node"]
    collector = RenamedFamilies()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)

    async def fetch(url: str) -> str:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=3)) as resp:
            resp.raise_for_status()
            return await resp.text()

    async def cycle() -> bytes:
        texts = await asyncio.gather(*(fetch(url) for url in spec["urls"]))
        gpus = await asyncio.to_thread(collect_gpus, provider, node)
        families = []
        for i, text in enumerate(texts):
            families += renamed_engine_families(text, identity(i, node))
        collector.families = families + gpu_families(gpus)
        body = generate_latest(registry)
        gzip.compress(body, compresslevel=6)
        return body

    return cycle


# ------------------------------------------------------------------------------------------ driver
async def main(mode: str, spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    session = new_session()
    try:
        cycle = await (ours if mode == "ours" else peer)(spec, session)
        await serve(cycle, lambda body: {"rss_kib": proc_status_kib("VmRSS"), "peak_rss_kib": proc_status_kib("VmHWM"),
                                         "series": output_series(body), "bytes": len(body)})
    finally:
        await session.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
