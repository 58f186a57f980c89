"""A flood of made-up model names through a real tap process leaves /metrics small and the real model's counts right.

Before model names were checked against the upstream's list, 64 requests with 1 MiB model names
made the tap's /metrics 67 MB (the node exporter dropped the whole target) and pushed the real
model out to `__other__`. Here 1,000 requests, each with its own random 1 MiB model name (half of
them starting like the class glob `chat-*`, so only the length rule stops those), are interleaved
with 100 requests for the model the upstream serves.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from exporter import promtext
from exporter.adapters import tap as tap_adapter
from exporter.model import MetricFamily
from llmslo import conventions as C
from tests.helpers.specs import slo_entry, sloth_spec

ROOT = Path(__file__).resolve().parents[2]
REAL_MODEL = "chat-a"
FLOOD = 1000
NAME_BYTES = 1 << 20
REAL = 100  # requests for the real model, one after every 10 made-up names
TOKENS = 3
MAX_PAGE_BYTES = 64 * 1024
SLO_YAML = sloth_spec("chat", slo_entry(
    "goodput-interactive", 95,
    '{plugin: {id: llmslo/goodput, options: {slo_class: interactive, ttft: "0.5", tpot: "0.1", models: "chat-*"}}}'))


def _sse(model: str, usage: bool) -> bytes:
    def event(doc: dict[str, object]) -> bytes:
        return b"data: " + json.dumps(doc).encode() + b"\n\n"

    out = [event({"model": model, "choices": [{"index": 0, "delta": {"content": f"t{i} "},
                                               "finish_reason": "stop" if i == TOKENS - 1 else None}]})
           for i in range(TOKENS)]
    if usage:
        out.append(event({"model": model, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": TOKENS,
                                                                     "total_tokens": TOKENS + 1}}))
    return b"".join(out) + b"data: [DONE]\n\n"


async def _lean_upstream() -> tuple[web.AppRunner, str]:
    """Serves REAL_MODEL; reads each request body and keeps none of it (1 GB passes through)."""

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": REAL_MODEL, "object": "model"}]})

    async def completions(request: web.Request) -> web.Response:
        body = await request.read()
        usage = b'"include_usage":true' in body[-200:] or b'"include_usage":true' in body[:200]
        return web.Response(body=_sse(REAL_MODEL, usage), content_type="text/event-stream")

    app = web.Application(client_max_size=4 * NAME_BYTES)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def _spawn_tap(upstream: str, slo: Path) -> tuple[asyncio.subprocess.Process, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "exporter.tap", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
        "--upstream", upstream, "--slo", str(slo), "--shutdown-grace", "2", cwd=ROOT,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    lines = []
    while True:
        line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
        lines.append(line)
        m = re.search(r"event=tap_listening proxy=(\S+) metrics=(\S+)", line)
        if m:
            return proc, m.group(1), m.group(2)
        if not line:
            raise AssertionError(f"the tap did not start: {''.join(lines)}")


def _body(model: bytes) -> bytes:
    return b'{"model":"' + model + b'","stream":true,"messages":[{"role":"user","content":"hi"}]}'


def _junk_name(i: int) -> bytes:
    prefix = b"chat-" if i % 2 else b""  # matches the class glob; only its length keeps it out
    return prefix + os.urandom(NAME_BYTES // 2).hex().encode()[: NAME_BYTES - len(prefix)]


def test_a_flood_of_made_up_model_names_leaves_metrics_small_and_the_real_model_intact(tmp_path: Path) -> None:
    slo = tmp_path / "slo.yaml"
    slo.write_text(SLO_YAML)

    async def go() -> tuple[int, dict[str, MetricFamily], float]:
        runner, upstream = await _lean_upstream()
        proc, proxy, metrics = await _spawn_tap(upstream, slo)
        try:
            started = time.monotonic()
            queue: asyncio.Queue[bytes | None] = asyncio.Queue()
            for i in range(FLOOD + REAL):
                queue.put_nowait(None if i % (FLOOD // REAL + 1) else REAL_MODEL.encode())
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) as s:

                async def worker() -> None:
                    while not queue.empty():
                        model = queue.get_nowait() or _junk_name(queue.qsize())
                        async with s.post(proxy + "/v1/chat/completions", data=_body(model)) as r:
                            assert r.status == 200
                            assert (await r.read()).endswith(b"data: [DONE]\n\n")

                await asyncio.gather(*(worker() for _ in range(4)))
                elapsed = time.monotonic() - started
                async with s.get(metrics) as r:
                    page = await r.read()
            return len(page), promtext.parse_page(page.decode()).families, elapsed
        finally:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
            await runner.cleanup()

    size, fams, elapsed = asyncio.run(go())
    print(f"{FLOOD} names of {NAME_BYTES} bytes through the tap in {elapsed:.1f} s; /metrics {size} bytes")
    assert size < MAX_PAGE_BYTES, size

    def value(d: C.MetricDef, suffix: str = "", **labels: str) -> float:
        fam = fams[tap_adapter.family_name(d)]
        return sum(s.value for s in fam.samples
                   if s.name == d.name + suffix and labels.items() <= s.labels.items())

    models = {s.labels.get("model") for fam in fams.values() for s in fam.samples} - {None}
    assert models == {REAL_MODEL, "__other__"}, sorted(m[:20] for m in models)  # type: ignore[index]
    real = {"model": REAL_MODEL, "slo_class": "interactive"}
    assert value(C.TAP_REQUESTS, **real, outcome=C.OUTCOME_OK) == REAL
    assert value(C.TAP_TTFT, "_count", **real) == REAL
    assert value(C.OUTPUT_TOKENS, **real, usage_source=C.USAGE_SOURCE_ENGINE) == REAL * TOKENS
    assert value(C.TAP_REQUESTS, model="__other__", outcome=C.OUTCOME_OK) == FLOOD
