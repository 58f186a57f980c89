"""`python -m bench.tap_process`: the tap with 64 models' series in its metrics, for the scrape benchmark.

The real TapServer on the CLI's event loop (uvloop when installed) and garbage-collector
settings, with TapMetrics pre-populated for MODELS models x the two classes (every outcome,
both usage sources, usage rejections), as a tap in front of a multi-LoRA engine would have.
A timer then records one request into every pre-populated series every CHURN_MS, spread
evenly, so that each of them changed between two scrapes 100 ms apart: the page has to be
rendered anew every time, the renderer's worst case.

`--render onloop` serves /metrics the way the tap did before exporter.tap.exposition:
prometheus_client.generate_latest over the whole registry, in one go, on the relaying loop.
Logs `event=tap_listening proxy=URL metrics=URL` on stderr once listening, as the tap does.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import signal
import sys

from aiohttp import web

from exporter.tap.classes import SloClass, SloConfig
from exporter.tap.server import TapServer
from exporter.tap.settings import TapSettings
from exporter.tap.timing import Timings
from llmslo import conventions as C

MODELS = 64
CLASSES = SloConfig(
    (SloClass("interactive", 0.5, 0.05, ("chat-*",)), SloClass("batch", 5.0, 0.2)),
    {"ttft": (0.5, 5.0), "tpot": (0.05, 0.2), "e2e": ()},
)
CHURN_MS = 100.0  # every pre-populated series gets one request per CHURN_MS
CHURN_TICK_MS = 10.0

log = logging.getLogger("llmslo.tap")


def _timings(rng: random.Random) -> Timings:
    return Timings(rng.random() / 20, rng.random(), rng.random() / 10, rng.random() * 30, rng.randrange(1, 500),
                   rng.choice((C.USAGE_SOURCE_ENGINE, C.USAGE_SOURCE_CHUNKS)))


def populate(server: TapServer, models: int, rng: random.Random) -> list[tuple[str, str]]:
    m = server.metrics
    keys = [(f"chat-model-{i:02d}", c) for i in range(models) for c in CLASSES.class_names]
    for model, cls in keys:
        for outcome in C.OUTCOMES:
            m.record(model, cls, outcome, _timings(rng), True)
        for _ in range(20):
            m.record(model, cls, C.OUTCOME_OK, _timings(rng), rng.random() < 0.7)
        m.usage_rejected(model, cls)
    return keys


async def churn(server: TapServer, keys: list[tuple[str, str]], rng: random.Random) -> None:
    ticks = max(1, round(CHURN_MS / CHURN_TICK_MS))
    per_tick = -(-len(keys) // ticks)
    i = 0
    while True:
        await asyncio.sleep(CHURN_TICK_MS / 1000)
        for _ in range(per_tick):
            model, cls = keys[i % len(keys)]
            server.metrics.record(model, cls, C.OUTCOME_OK, _timings(rng), True)
            i += 1


class OnLoopTapServer(TapServer):
    """/metrics as before: prometheus_client's generate_latest of the whole registry, on the loop."""

    def _metrics_app(self) -> web.Application:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        registry = self.metrics.registry

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        return app


async def serve(args: argparse.Namespace) -> None:
    from exporter.tap.cli import _tune_gc

    cls = OnLoopTapServer if args.render == "onloop" else TapServer
    server = cls(TapSettings(args.upstream), CLASSES, shutdown_timeout_s=2.0)
    rng = random.Random(1)
    keys = populate(server, args.models, rng)
    await server.start(("127.0.0.1", 0), ("127.0.0.1", 0))
    _tune_gc()
    assert server.proxy_address and server.metrics_address
    churner = asyncio.get_running_loop().create_task(churn(server, keys, rng))
    print(f"event=tap_listening proxy={server.proxy_address.url()} metrics={server.metrics_address.url()}/metrics "
          f"render={args.render}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    churner.cancel()
    await server.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--upstream", required=True)
    p.add_argument("--models", type=int, default=MODELS)
    p.add_argument("--render", choices=("sliced", "onloop"), default="sliced")
    args = p.parse_args()
    import prometheus_client

    prometheus_client.disable_created_metrics()
    from exporter.tap.cli import _runner

    with _runner("auto") as runner:
        runner.run(serve(args))


if __name__ == "__main__":
    main()
