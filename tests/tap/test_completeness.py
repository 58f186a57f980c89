"""Complete means complete: a stream is `ok` only if it ended with the engine's final event, and a usage
count the response could not hold is not believed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from exporter.tap.policy import plausible_usage
from llmslo import conventions as C
from tests.tap.test_faults import body, wait_for

CHAT = "/v1/chat/completions"




@pytest.mark.parametrize(("headers", "outcome"), [
    ({}, C.OUTCOME_OK),  # role, tokens, finish_reason, usage, [DONE]
    ({"x-test-no-done": "1"}, C.OUTCOME_OK),  # engines that end with the finish_reason and send no [DONE]
    ({"x-test-end-after": "3"}, C.OUTCOME_TRUNCATED),  # chunked body ended cleanly after 3 tokens
    ({"x-test-end-after": "0"}, C.OUTCOME_TRUNCATED),  # ended before any token
])
def test_a_stream_without_its_final_event_is_truncated(stack: Callable, headers: dict[str, str], outcome: str) -> None:
    async def go() -> None:
        async with stack() as st:
            async with aiohttp.ClientSession() as s:
                async with s.post(st.tap_url + CHAT, data=body(), headers={"x-test-chunks": "6", **headers}) as r:
                    assert r.status == 200
                    await r.read()  # the client gets the bytes the engine sent, either way
            await wait_for(lambda: len(st.records) == 1)
            rec = st.records[0]
            assert rec.outcome == outcome
            assert rec.good is (outcome == C.OUTCOME_OK)
            assert st.value(C.TAP_REQUESTS.name, outcome=outcome) == 1

    asyncio.run(go())


async def _close_delimited_upstream(events: list[bytes]) -> tuple[asyncio.AbstractServer, str]:
    """An upstream that answers with an SSE body ended by closing the connection (no length, no chunks)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(v for k, _, v in (line.partition(b":") for line in head.split(b"\r\n"))
                          if k.lower() == b"content-length"))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for ev in events:
            writer.write(ev)
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


TOKEN = _event({"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]})
LAST = _event({"choices": [{"index": 0, "delta": {"content": "!"}, "finish_reason": "stop"}]})


@pytest.mark.parametrize(("events", "outcome"), [
    ([TOKEN, TOKEN, LAST, b"data: [DONE]\n\n"], C.OUTCOME_OK),
    ([TOKEN, TOKEN], C.OUTCOME_TRUNCATED),  # cut by the close before the final event: re-terminated by the tap
])
def test_a_close_delimited_stream_cut_short_is_truncated(stack: Callable, events: list[bytes], outcome: str) -> None:
    async def go() -> None:
        server, url = await _close_delimited_upstream(events)
        try:
            async with stack(upstream_url=url, inject_usage=False) as st:
                async with aiohttp.ClientSession() as s:
                    async with s.post(st.tap_url + CHAT, data=body()) as r:
                        got = await r.read()
                assert got == b"".join(events)
                await wait_for(lambda: len(st.records) == 1)
                assert st.records[0].outcome == outcome
        finally:
            server.close()

    asyncio.run(go())


@pytest.mark.parametrize(("usage", "max_tokens", "believed"), [
    ("6", None, True),
    (str(10**23), None, False),  # more tokens than the response has bytes
    ("50", 8, False),  # more than the request allowed
    ("8", 8, True),
])
def test_implausible_usage_is_ignored_for_the_chunk_count(stack: Callable, usage: str, max_tokens: int | None,
                                                          believed: bool) -> None:
    async def go() -> None:
        async with stack() as st:
            extra = {"max_tokens": max_tokens} if max_tokens else {}
            async with aiohttp.ClientSession() as s:
                async with s.post(st.tap_url + CHAT, data=body(**extra),
                                  headers={"x-test-chunks": "6", "x-test-usage-tokens": usage}) as r:
                    await r.read()
            await wait_for(lambda: len(st.records) == 1)
            t = st.records[0].timings
            assert (t.n_out, t.usage_source) == ((int(usage), C.USAGE_SOURCE_ENGINE) if believed else (6, C.USAGE_SOURCE_CHUNKS))
            assert st.value(C.TAP_USAGE_REJECTED.name) == (0 if believed else 1)
            assert st.value(C.OUTPUT_TOKENS.name) == t.n_out

    asyncio.run(go())


def test_implausible_usage_in_a_non_streamed_body_is_ignored(stack: Callable) -> None:
    async def go() -> None:
        async with stack() as st:
            async with aiohttp.ClientSession() as s:
                async with s.post(st.tap_url + CHAT, data=body(stream=False),
                                  headers={"x-test-chunks": "4", "x-test-usage-tokens": str(10**23)}) as r:
                    await r.read()
            await wait_for(lambda: len(st.records) == 1)
            assert st.records[0].timings.n_out == 0  # no output events to count in a plain body: nothing believed
            assert st.value(C.TAP_USAGE_REJECTED.name) == 1

    asyncio.run(go())


def test_plausible_usage_bounds() -> None:
    assert plausible_usage(100, 100, 1, 10_000)
    assert not plausible_usage(101, 100, 1, 10_000)
    assert plausible_usage(200, 100, 2, 10_000)  # n=2 choices
    assert not plausible_usage(10_001, None, 1, 10_000)
