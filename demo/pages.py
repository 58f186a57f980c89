"""A tiny built-in engine stand-in: a vLLM-V1-shaped /metrics page whose values move.

Used by the demo when the simulator is not installed, so `make demo` works from a bare checkout
without any GPU, engine or reference data. It serves only /metrics; it is not an engine model.
"""

from __future__ import annotations

import random

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from llmslo.conventions import VLLM

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
BLOCKS = 27102
BLOCK_SIZE = 16


class FakeVllmPage:
    """Random-walk load on one model; every scrape advances it one step."""

    def __init__(self, model: str, seed: int = 0):
        self.model = model
        self.rng = random.Random(seed)
        self.registry = r = CollectorRegistry()
        lbl = [VLLM.LABEL_ENGINE, VLLM.LABEL_MODEL_NAME]
        self.running = Gauge(VLLM.NUM_REQUESTS_RUNNING, "Number of requests in model execution batches.", lbl, registry=r)
        self.waiting = Gauge(VLLM.NUM_REQUESTS_WAITING, "Number of requests waiting to be processed.", lbl, registry=r)
        self.kv = Gauge(VLLM.KV_CACHE_USAGE_PERC, "KV-cache usage. 1 means 100 percent usage.", lbl, registry=r)
        self.preempt = Counter(VLLM.NUM_PREEMPTIONS, "Cumulative number of preemption from the engine.", lbl, registry=r)
        self.prompt = Counter(VLLM.PROMPT_TOKENS, "Number of prefill tokens processed.", lbl, registry=r)
        self.gen = Counter(VLLM.GENERATION_TOKENS, "Number of generation tokens processed.", lbl, registry=r)
        self.success = Counter(VLLM.REQUEST_SUCCESS, "Count of successfully processed requests.",
                               lbl + [VLLM.LABEL_FINISHED_REASON], registry=r)
        self.ttft = Histogram(VLLM.TTFT, "Histogram of time to first token in seconds.", lbl, buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(VLLM.ITL, "Histogram of inter-token latency in seconds.", lbl, buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram(VLLM.E2E, "Histogram of e2e request latency in seconds.", lbl, buckets=E2E_BUCKETS, registry=r)
        info = Gauge(VLLM.CACHE_CONFIG_INFO, "Information of the LLMEngine CacheConfig",
                     ["block_size", "num_gpu_blocks", "engine"], registry=r)
        info.labels(block_size=str(BLOCK_SIZE), num_gpu_blocks=str(BLOCKS), engine="0").set(1)
        self.labels = {"engine": "0", "model_name": model}
        self.load = 0.3

    def step(self) -> None:
        rng = self.rng
        self.load = min(1.0, max(0.05, self.load + rng.uniform(-0.08, 0.1)))
        running = int(self.load * 48)
        waiting = max(0, int((self.load - 0.8) * 60))
        self.running.labels(**self.labels).set(running)
        self.waiting.labels(**self.labels).set(waiting)
        self.kv.labels(**self.labels).set(round(min(0.99, self.load * 0.95), 4))
        finished = rng.randint(2, 6)
        for _ in range(finished):
            out_tokens = rng.randint(20, 400)
            ttft = rng.lognormvariate(-2.6 + 1.5 * self.load, 0.5)
            itl = rng.lognormvariate(-4.0 + 0.6 * self.load, 0.3)
            self.ttft.labels(**self.labels).observe(ttft)
            self.itl.labels(**self.labels).observe(itl)
            self.e2e.labels(**self.labels).observe(ttft + itl * out_tokens)
            self.prompt.labels(**self.labels).inc(rng.randint(50, 2000))
            self.gen.labels(**self.labels).inc(out_tokens)
            reason = "stop" if rng.random() < 0.9 else "length"
            self.success.labels(**self.labels, finished_reason=reason).inc()
        if self.load > 0.9:
            self.preempt.labels(**self.labels).inc(rng.randint(0, 2))

    def render(self) -> bytes:
        self.step()
        return generate_latest(self.registry)


async def start_page_server(pages: list[FakeVllmPage]) -> tuple[web.AppRunner, list[str]]:
    """Serve each page at /<i>/metrics on a free loopback port; returns the runner and the URLs."""
    app = web.Application()
    for i, page in enumerate(pages):
        async def handler(request: web.Request, page: FakeVllmPage = page) -> web.Response:
            return web.Response(body=page.render(), content_type="text/plain")

        app.router.add_get(f"/{i}/metrics", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, [f"http://127.0.0.1:{port}/{i}/metrics" for i in range(len(pages))]
