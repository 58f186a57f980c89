"""Deadlines measure progress, not bytes: an engine that hangs after its first token but keeps the
connection busy (SSE keep-alive comments as TGI sends every 15 s, blank lines, an event dribbled a
byte at a time, whitespace in a non-streamed body) still ends in `upstream_timeout`, and while such a
request is late, the in-flight-late gauge shows it.

The upstream is a real aiohttp server of the test's own, steered by the `x-mode` header."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from exporter.tap.classes import SloClass, SloConfig
from exporter.tap.policy import RequestRecord
from llmslo import conventions as C
from tests.tap.conftest import start_app
from tests.tap.test_faults import body, wait_for

CHAT = "/v1/chat/completions"
CLASSES = SloConfig((SloClass("interactive", 0.5, 0.05, ("chat-*",)),), {"ttft": (0.5,), "tpot": (0.05,), "e2e": ()})
TICK_S = 0.05  # how often the hung upstream sends its filler
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'


def _token(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


async def _filler(mode: str, write: Callable) -> None:
    """Bytes that prove the connection, never the engine, sent until the tap gives up on them."""
    partial = _token("never finished")[:-2]
    i = 0
    while True:
        if mode == "comment":
            await write(b": keep-alive\n\n")
        elif mode == "blank":
            await write(b"\n")
        elif mode == "dribble":  # one event, a byte at a time, never terminated
            await write(partial[i % len(partial) : i % len(partial) + 1])
            i += 1
        elif mode == "whitespace":
            await write(b" ")
        await asyncio.sleep(TICK_S)


async def _chat(request: web.Request) -> web.StreamResponse:
    mode = request.headers.get("x-mode", "comment")
    doc = await request.json()
    if not doc.get("stream"):
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}')
        await _filler(mode, response.write)
        return response
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(ROLE)
    if mode == "paced":  # healthy: a token every 0.2 s, keep-alive comments in between
        for k in range(8):
            await response.write(_token(f"t{k}"))
            for _ in range(4):
                await asyncio.sleep(0.05)
                await response.write(b": keep-alive\n\n")
        await response.write(b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
        return response
    await response.write(_token("first"))
    await _filler(mode, response.write)
    return response


def _app() -> web.Application:
    app = web.Application()
    app.router.add_post(CHAT, _chat)
    return app


async def _broken_off(stack: Callable, mode: str, stream: bool) -> RequestRecord:
    """One request through a tap with a 0.5 s stall deadline to the upstream in `mode`, whose answer the tap
    must break off; the tap's record of it."""
    runner, url = await start_app(_app())
    try:
        async with stack(slo=CLASSES, upstream_url=url, stall_timeout_s=0.5) as st:
            async with aiohttp.ClientSession() as s:
                r = await s.post(st.tap_url + CHAT, data=body(stream=stream), headers={"x-mode": mode})
                assert r.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    await asyncio.wait_for(r.read(), 10.0)  # broken off by the tap, not by this timeout
            await wait_for(lambda: len(st.records) == 1)
            return st.records[0]
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("mode", ["comment", "blank", "dribble"])
def test_a_stream_hung_after_its_first_token_times_out_whatever_bytes_keep_it_busy(stack: Callable, mode: str) -> None:
    record = asyncio.run(_broken_off(stack, mode, stream=True))
    assert record.outcome == C.OUTCOME_UPSTREAM_TIMEOUT
    assert record.timings.ttft is not None


def test_a_non_streamed_body_dribbling_whitespace_times_out(stack: Callable) -> None:
    record = asyncio.run(_broken_off(stack, "whitespace", stream=False))
    assert record.outcome == C.OUTCOME_UPSTREAM_TIMEOUT


def test_keep_alives_between_tokens_on_time_do_not_end_a_healthy_stream(stack: Callable) -> None:
    """Tokens 0.2 s apart under a 0.5 s stall deadline, comments in between: the stream completes."""

    async def go() -> None:
        runner, url = await start_app(_app())
        try:
            async with stack(slo=CLASSES, upstream_url=url, stall_timeout_s=0.5) as st:
                async with aiohttp.ClientSession() as s:
                    async with s.post(st.tap_url + CHAT, data=body(), headers={"x-mode": "paced"}) as r:
                        text = await r.read()
                assert text.endswith(b"data: [DONE]\n\n")
                await wait_for(lambda: len(st.records) == 1)
                assert st.records[0].outcome == C.OUTCOME_OK
                assert st.records[0].timings.n_out >= 8
        finally:
            await runner.cleanup()

    asyncio.run(go())


# -- the in-flight-late gauge ----------------------------------------------------------------------
async def _late(session: aiohttp.ClientSession, metrics_url: str) -> dict[tuple[str, str], float]:
    async with session.get(metrics_url + "/metrics") as r:
        text = await r.text()
    return {
        (s.labels["model"], s.labels["slo_class"]): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == C.TAP_IN_FLIGHT_LATE.name
    }


@pytest.mark.parametrize("headers", [
    {"x-test-hang-ms": "60000"},  # no first token: late once the TTFT objective (0.5 s) passed
    {"x-test-chunks": "3", "x-test-delay-ms": "60000"},  # one token, then nothing: the TPOT pace is lost
], ids=["ttft", "tpot"])
def test_a_hung_stream_shows_in_the_in_flight_late_gauge_until_it_ends(stack: Callable, headers: dict) -> None:
    async def go() -> None:
        async with stack(slo=CLASSES) as st:
            async with aiohttp.ClientSession() as scraper:
                assert (await _late(scraper, st.metrics_url)).get(("chat-a", "interactive")) == 0
                client = aiohttp.ClientSession()
                task = asyncio.create_task(client.post(st.tap_url + CHAT, data=body(), headers=headers))
                if "x-test-hang-ms" in headers:
                    await asyncio.sleep(0.1)
                    assert (await _late(scraper, st.metrics_url)).get(("chat-a", "interactive")) == 0  # on time yet
                shown = None
                for _ in range(100):
                    await asyncio.sleep(0.05)
                    shown = (await _late(scraper, st.metrics_url)).get(("chat-a", "interactive"))
                    if shown == 1:
                        break
                assert shown == 1
                assert not st.records  # shown while it is still in flight
                await client.close()  # the client leaves
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await wait_for(lambda: len(st.records) == 1)
                assert (await _late(scraper, st.metrics_url)).get(("chat-a", "interactive")) == 0
            assert st.records[0].outcome == C.OUTCOME_CLIENT_GAVE_UP

    asyncio.run(go())
