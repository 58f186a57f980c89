"""`python -m bench.tap_render_lag MODE`: how late the tap's event loop runs while its /metrics is scraped.

A tap (TapServer, on uvloop, the CLI's GC settings) holds bench.tap_process's 64 models x 2
classes, every series changing between two scrapes; bench.scraper reads /metrics every 100 ms
from its own process. A 1 ms timer on the tap's loop measures how late each of its ticks runs:
that lateness is what a relayed chunk due at the same moment would wait. MODE says how the page
is rendered and written:

  none              no page at all (an empty body): the floor of the machine and the loop
  sliced            the tap's own way (exporter.tap.exposition: slices, pieces)
  sliced-onebuffer  the same rendering, the page written as one buffer
  thread-ours       the same renderer run in a thread (run_in_executor), written as one buffer
  thread-prom       prometheus_client.generate_latest in a thread
  onloop            prometheus_client.generate_latest on the loop: the tap before this renderer

Prints one JSON line: the ticks' lateness percentiles and the scraper's figures.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from pathlib import Path

from aiohttp import web

from bench import tap_process
from exporter.tap.server import TapServer
from exporter.tap.settings import TapSettings

ROOT = Path(__file__).resolve().parent.parent
MODES = ("none", "sliced", "sliced-onebuffer", "thread-ours", "thread-prom", "onloop")
MEASURE_S = 4.0
TICK_S = 0.001


class Server(TapServer):
    mode = "sliced"

    def _metrics_app(self) -> web.Application:
        if self.mode == "sliced":
            return super()._metrics_app()
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        registry, renderer, mode = self.metrics.registry, self.renderer, self.mode

        async def metrics(_: web.Request) -> web.Response:
            loop = asyncio.get_running_loop()
            if mode == "onloop":
                body = generate_latest(registry)
            elif mode == "thread-prom":
                body = await loop.run_in_executor(None, generate_latest, registry)
            elif mode == "thread-ours":
                body = await loop.run_in_executor(None, renderer.render_now)
            elif mode == "sliced-onebuffer":
                body = await renderer.render()
            else:
                body = b""
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        return app


async def measure(mode: str) -> dict[str, object]:
    from exporter.tap.cli import _tune_gc

    Server.mode = mode
    server = Server(TapSettings("http://127.0.0.1:1"), tap_process.CLASSES, models_refresh_s=0)
    rng = random.Random(1)
    keys = tap_process.populate(server, tap_process.MODELS, rng)
    await server.start(("127.0.0.1", 0), ("127.0.0.1", 0))
    _tune_gc()
    churn = asyncio.get_running_loop().create_task(tap_process.churn(server, keys, rng))
    assert server.metrics_address is not None
    scraper = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.scraper", server.metrics_address.url() + "/metrics", "100", cwd=ROOT,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    await asyncio.sleep(0.5)
    lateness: list[float] = []
    end = time.perf_counter() + MEASURE_S
    while time.perf_counter() < end:
        t = time.perf_counter()
        await asyncio.sleep(TICK_S)
        lateness.append(time.perf_counter() - t - TICK_S)
    assert scraper.stdin is not None and scraper.stdout is not None
    scraper.stdin.close()
    scrapes = json.loads((await scraper.stdout.read()).decode().strip().splitlines()[-1])
    await scraper.wait()
    churn.cancel()
    await server.stop()
    lateness.sort()

    def pct(q: float) -> float:
        return lateness[min(len(lateness) - 1, int(q * len(lateness)))] * 1000

    return {"mode": mode, "ticks": len(lateness), "p50_ms": pct(0.5), "p99_ms": pct(0.99), "p999_ms": pct(0.999),
            "max_ms": lateness[-1] * 1000, "scrapes": scrapes}


def main() -> None:
    mode = sys.argv[1]
    if mode not in MODES:
        raise SystemExit(f"MODE is one of {', '.join(MODES)}")
    import prometheus_client

    prometheus_client.disable_created_metrics()
    from exporter.tap.cli import _runner

    with _runner("auto") as runner:
        print(json.dumps(runner.run(measure(mode))), flush=True)


if __name__ == "__main__":
    main()
