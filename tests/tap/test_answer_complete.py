"""A stream whose answer is complete is judged by its answer, not by what its transport does afterwards.

The upstream is a raw loopback HTTP/1.1 server of the test's own that sends a whole answer and then holds its
connection open (as attack scripts did for 8 s, issue 34): `data: [DONE]` without the chunked body's end; or the
final chunk with finish_reason and usage and no `[DONE]` yet; or `[DONE]` and then a close without the body's
end; or `[DONE]` and then data events for ever. Under a 0.5 s stall deadline each used to end as
`upstream_timeout` (or `aborted`); now each is `ok` and good, its E2E ends at the answer's last event (before the
tap closed the upstream connection, which it does within the grace), and the client gets a whole response.
The neighbour: a non-streamed body with a Content-Length, fully received and then held open, ends at once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import pytest

from exporter.tap.classes import SloClass, SloConfig
from exporter.tap.deadlines import ANSWERED_GRACE_S
from llmslo import conventions as C
from tests.tap.test_faults import body, wait_for

CHAT = "/v1/chat/completions"
CLASSES = SloConfig((SloClass("interactive", 0.5, 0.05, ("chat-*",)),), {"ttft": (0.5,), "tpot": (0.05,), "e2e": ()})
STALL_S = 0.5
GRACE_S = min(ANSWERED_GRACE_S, STALL_S)
TOKENS = 5
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(doc: dict) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def _token(text: str) -> bytes:
    return _event({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


FINISH = _event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
FINISH_USAGE = _event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": TOKENS, "total_tokens": TOKENS + 3}})
DONE = b"data: [DONE]\n\n"
JSON_BODY = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi there"},
                                     "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}).encode()


@dataclass
class HeldUpstream:
    """Sends a whole answer in `mode`, then holds the connection until the tap closes it or `release` is set."""

    mode: str
    release: asyncio.Event = field(default_factory=asyncio.Event)
    answered_at: float | None = None  # time.perf_counter (the tap's clock) when the answer's last byte went out
    eof_at: float | None = None  # when the tap closed its side (None: it never did)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        await self._answer(writer)
        self.answered_at = time.perf_counter()
        if self.mode == "done_then_close":
            writer.close()
            return
        chatter = asyncio.ensure_future(self._chatter(writer)) if self.mode == "done_then_chatter" else None
        eof = asyncio.ensure_future(reader.read())
        await asyncio.wait([eof, asyncio.ensure_future(self.release.wait())], return_when=asyncio.FIRST_COMPLETED)
        if eof.done():
            self.eof_at = time.perf_counter()
        if chatter is not None:
            chatter.cancel()
        eof.cancel()
        writer.close()

    async def _answer(self, writer: asyncio.StreamWriter) -> None:
        if self.mode == "length":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                         % len(JSON_BODY) + JSON_BODY)
            await writer.drain()
            return
        writer.write(SSE_HEAD)
        for k in range(TOKENS):
            writer.write(_chunk(_token(f"t{k}")))
            await writer.drain()
            await asyncio.sleep(0.01)
        last = FINISH_USAGE if self.mode == "finish_usage_held" else FINISH + DONE
        writer.write(_chunk(last))
        await writer.drain()

    async def _chatter(self, writer: asyncio.StreamWriter) -> None:
        """Data events after [DONE], for ever: they must not keep the tap relaying."""
        while True:
            await asyncio.sleep(0.05)
            writer.write(_chunk(b'data: {"choices":[]}\n\n'))


async def _through_tap(stack: Callable, mode: str, inject_usage: bool = True) -> tuple[HeldUpstream, object, bytes]:
    upstream = HeldUpstream(mode)
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
    url = "http://127.0.0.1:%d" % server.sockets[0].getsockname()[1]
    try:
        async with stack(slo=CLASSES, upstream_url=url, stall_timeout_s=STALL_S, inject_usage=inject_usage) as st:
            async with aiohttp.ClientSession() as s:
                r = await s.post(st.tap_url + CHAT, data=body(stream=mode != "length"))
                assert r.status == 200
                got = await asyncio.wait_for(r.read(), 10.0)  # a whole response: no ClientPayloadError
            await wait_for(lambda: len(st.records) == 1, timeout=10.0)  # while the upstream still holds on
            upstream.release.set()
            return upstream, st.records[0], got
    finally:
        upstream.release.set()
        server.close()


@pytest.mark.parametrize("inject_usage", [True, False], ids=["own-chunks", "upstream-chunks"])
@pytest.mark.parametrize("mode", ["done_held", "finish_usage_held", "done_then_chatter"])
def test_a_complete_stream_held_open_is_ok_and_timed_to_its_answer(stack: Callable, mode: str,
                                                                   inject_usage: bool) -> None:
    upstream, record, got = asyncio.run(_through_tap(stack, mode, inject_usage))
    assert record.outcome == C.OUTCOME_OK, record
    assert record.good  # 5 tokens ~10 ms apart under 0.5 s / 0.05 s objectives
    assert b'"finish_reason":"stop"' in got
    # E2E ends at the answer's last event, not when the tap gave up on the transport: the tap closed the
    # upstream connection (politely: the upstream read its end) a grace period after that event.
    end = record.arrival + record.timings.e2e
    assert upstream.answered_at is not None and upstream.eof_at is not None
    assert upstream.answered_at <= end < upstream.eof_at - GRACE_S * 0.8
    if mode == "finish_usage_held":
        assert record.timings.n_out == TOKENS and record.timings.usage_source == C.USAGE_SOURCE_ENGINE


def test_done_then_the_upstream_closes_without_the_bodys_end_is_ok(stack: Callable) -> None:
    upstream, record, got = asyncio.run(_through_tap(stack, "done_then_close", inject_usage=False))
    assert record.outcome == C.OUTCOME_OK
    assert record.good and got.endswith(DONE)


def test_a_body_with_a_length_fully_received_then_held_open_ends_at_once(stack: Callable) -> None:
    upstream, record, got = asyncio.run(_through_tap(stack, "length"))
    assert got == JSON_BODY
    assert record.outcome == C.OUTCOME_OK and record.timings.n_out == 2
    assert upstream.eof_at is None  # recorded while the upstream still held the (reusable) connection
    assert upstream.answered_at <= record.arrival + record.timings.e2e
