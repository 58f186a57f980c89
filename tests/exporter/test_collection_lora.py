"""A large node's collection: 8 vLLM engines over loopback HTTP, each with 64 or more LoRA adapters in flight.

The pages come from the simulator's vLLM metrics (the real family names and labels, adapters comma-separated in
`lora_requests_info`). The default cap (64 adapters per target) must keep exactly the alphabetically first 64
adapters of each engine, count the rest as dropped, and leave the engines' adapter totals untouched.
"""

from __future__ import annotations

import asyncio
import random

from aiohttp import web

from exporter.collector import Collector, Snapshot
from exporter.config import ExporterConfig, Limits, TargetConfig
from exporter.gpu import FakeProvider
from exporter.guard import LORA_ADAPTER_LIMIT
from exporter.sources.http import new_session
from llmslo import conventions as c
from simulator.clock import VirtualClock
from simulator.config import EngineConfig
from simulator.engine import EngineCore
from simulator.metrics import VllmMetrics
from simulator.request import Status

NODE = "node-lora"
CAP = Limits().max_lora_adapters_per_target  # the default: 64
ADAPTERS_PER_ENGINE = [CAP, CAP + 8] * 4  # 8 engines: half exactly at the cap, half over it


def adapter_names(count: int) -> list[str]:
    return [f"adapter-{i:03d}" for i in range(count)]


def vllm_page_with_adapters(count: int, seed: int) -> bytes:
    """The simulator's vLLM page once one long request per adapter (shuffled) has reached the scheduler."""
    rng = random.Random(seed)
    names = adapter_names(count)
    core = EngineCore(EngineConfig(lora_adapters=tuple(names), max_loras=8, seed=seed), VirtualClock())
    metrics = VllmMetrics(core)
    rng.shuffle(names)
    requests = [core.new_request([rng.randrange(1 << 40) for _ in range(64)], 500, output_len=500, lora=name)
                for name in names]
    for req in requests:
        core.add_request(req)
    while any(r.status is Status.PENDING for r in requests) or not core.scheduler.running:
        planned = core.begin_step()
        if planned is None:
            core.clock.set(core.next_wakeup())
            continue
        core.clock.advance(planned.duration)
        core.finish_step(planned)
    return metrics.render()


def collect_node(pages: list[bytes]) -> Snapshot:
    async def go() -> Snapshot:
        async def serve(request: web.Request) -> web.Response:
            return web.Response(body=pages[int(request.match_info["i"])], content_type="text/plain")

        app = web.Application()
        app.router.add_get("/{i}/metrics", serve)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            base = f"http://127.0.0.1:{runner.addresses[0][1]}"
            targets = tuple(TargetConfig("vllm", f"{base}/{i}/metrics", name=f"engine-{i}", pod=f"vllm-{i}")
                            for i in range(len(pages)))
            config = ExporterConfig(targets=targets, interval_s=5)
            async with new_session() as session:
                return await Collector(config, session, FakeProvider(8), NODE).collect(targets)
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def values(snapshot: Snapshot, metric: c.MetricDef, **labels: str) -> list:
    return [s for s in snapshot.samples
            if s.metric.name == metric.name and all(s.labels.get(k) == v for k, v in labels.items())]


def test_eight_engines_with_many_adapters_keep_the_first_64_of_each_and_count_the_rest():
    pages = [vllm_page_with_adapters(n, seed=i) for i, n in enumerate(ADAPTERS_PER_ENGINE)]
    for page, n in zip(pages, ADAPTERS_PER_ENGINE, strict=True):  # the pages really carry every adapter, comma-separated
        assert all(name.encode() in page for name in adapter_names(n))

    snap = collect_node(pages)

    assert all(t.up for t in snap.targets), [(t.target, t.reason) for t in snap.targets]
    assert snap.gpus_up == 8
    active = values(snap, c.LORA_ADAPTER_ACTIVE)
    assert len(active) == CAP * len(pages)
    for i, n in enumerate(ADAPTERS_PER_ENGINE):
        pod = f"vllm-{i}"
        kept = values(snap, c.LORA_ADAPTER_ACTIVE, pod=pod)
        assert sorted(s.labels[c.LABEL_ADAPTER] for s in kept) == adapter_names(CAP)
        states = {s.labels[c.LABEL_LORA_STATE] for s in kept}
        assert states <= {c.LORA_STATE_RUNNING, c.LORA_STATE_WAITING}
        if n == CAP:  # nothing cut: both the running adapters and the waiting ones are there
            assert states == {c.LORA_STATE_RUNNING, c.LORA_STATE_WAITING}
        [dropped] = values(snap, c.EXPORTER_SERIES_DROPPED, target=f"engine-{i}", reason=LORA_ADAPTER_LIMIT)
        assert dropped.value == n - CAP
        # The engine's own totals are not capped: running + waiting adapters still add up to all of them.
        [running] = values(snap, c.LORA_ADAPTERS_RUNNING, pod=pod)
        [waiting] = values(snap, c.LORA_ADAPTERS_WAITING, pod=pod)
        assert running.value + waiting.value == n
        assert 1 <= running.value <= 8
