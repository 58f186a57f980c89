"""HTTP/1.1 edge cases of the tap that a plain engine rarely produces but some do: bodiless responses
(HEAD, 204, 304), odd response framing (Transfer-Encoding with Content-Length, trailers, HTTP/1.0),
very large bodies, early answers, pipelining behind a stream, a client leaving while the tap
connects, and a garbled status line.

Most cases need an upstream that sends exactly certain bytes, so they run a tiny raw asyncio
server (`_scripted_upstream`) behind the real tap instead of the aiohttp test upstream."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from exporter.tap import http1, relay, upstream
from llmslo import conventions as C
from tests.tap.test_http_conformance import CHAT, Client, chat_body, get, post, sha, wait_for

# (method, target, request body) -> (pieces to write, with a short pause between them; close afterwards?)
Answer = Callable[[bytes, bytes, bytes], tuple[list[bytes], bool]]


@dataclass
class Upstream:
    """A raw upstream behind the tap and what it saw: one list of (method, target) per connection."""

    server: asyncio.AbstractServer
    url: str
    connections: list[list[tuple[bytes, bytes]]] = field(default_factory=list)

    @property
    def requests(self) -> list[tuple[bytes, bytes]]:
        return [r for conn in self.connections for r in conn]


async def _scripted_upstream(answer: Answer, pause_s: float = 0.01) -> Upstream:
    """An upstream that reads whole requests (Content-Length bodies) in a keep-alive loop and writes
    what `answer` says, piece by piece, so framing split across reads is exercised too."""
    up: Upstream

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen: list[tuple[bytes, bytes]] = []
        up.connections.append(seen)
        try:
            while True:
                try:
                    raw = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                head = http1.parse_request_head(raw[:-4])
                body = await reader.readexactly(int(head.get(b"content-length") or 0))
                seen.append((head.method, head.target))
                pieces, close = answer(head.method, head.target, body)
                for i, piece in enumerate(pieces):
                    if i:
                        await asyncio.sleep(pause_s)
                    writer.write(piece)
                    await writer.drain()
                if close:
                    return
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    up = Upstream(server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    return up


def _ok(payload: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)


async def _next_is_answered_in_step(c: Client, up: Upstream, why: str) -> None:
    """The client's next request on the same connection gets its own answer, over the one upstream connection
    (`why` says what that proves); then the client closes."""
    await c.send(get(b"/next"))
    r = await c.response()
    assert r.status == 200 and r.body == b"next"
    assert len(up.connections) == 1, why
    c.close()


def _run_with(answer: Answer, test: Callable[[Any, Upstream], Awaitable[None]], stack: Callable, **settings: Any) -> None:
    async def go() -> None:
        up = await _scripted_upstream(answer)
        try:
            async with stack(upstream_url=up.url, **settings) as st:
                await test(st, up)
        finally:
            up.server.close()

    asyncio.run(go())


# -- bodiless responses ------------------------------------------------------------------------
def test_head_response_has_the_length_field_but_no_body_and_the_connection_stays_in_step(stack: Callable) -> None:
    """A HEAD answer carries the Content-Length a GET would have but no body: a proxy that waits
    for those 1234 bytes hangs the client and misreads the next response on both connections."""

    def answer(method: bytes, target: bytes, body: bytes) -> tuple[list[bytes], bool]:
        if method == b"HEAD":
            return [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1234\r\n\r\n"], False
        return [_ok(b"after head")], False

    async def test(st: Any, up: Upstream) -> None:
        c = await Client.open(st.tap_url)
        await c.send(b"HEAD /v1/models HTTP/1.1\r\nHost: tap\r\n\r\n")
        r = await c.response(b"HEAD")
        assert r.status == 200 and r.field(b"content-length") == b"1234" and r.body == b""
        assert await c.still_open() and c.buf == b"", "no body bytes after a HEAD answer"
        await c.send(get(b"/after"))
        r = await c.response()
        assert r.status == 200 and r.body == b"after head"
        assert up.connections == [[(b"HEAD", b"/v1/models"), (b"GET", b"/after")]], "the upstream connection was reused"
        c.close()

    _run_with(answer, test, stack)


@pytest.mark.parametrize(
    "status_head",
    [
        b"HTTP/1.1 204 No Content\r\nX-Kind: empty\r\n\r\n",
        # A 304's Content-Length is the length the representation would have (RFC 9110 8.6): no body follows.
        b'HTTP/1.1 304 Not Modified\r\nETag: "v1"\r\nContent-Length: 50\r\n\r\n',
    ],
    ids=["204", "304"],
)
def test_204_and_304_are_relayed_without_a_body(stack: Callable, status_head: bytes) -> None:
    """204 and 304 never have a body whatever their fields say (RFC 9112 6.3); waiting for one stalls the connection."""
    status = int(status_head[9:12])

    def answer(method: bytes, target: bytes, body: bytes) -> tuple[list[bytes], bool]:
        return [status_head if target == b"/empty" else _ok(b"next")], False

    async def test(st: Any, up: Upstream) -> None:
        c = await Client.open(st.tap_url)
        await c.send(get(b"/empty", b'If-None-Match: "v1"'))
        r = await c.response()
        assert r.status == status and r.body == b""
        assert r.field(b"transfer-encoding") is None, "no chunked framing is invented for a bodiless status"
        assert await c.still_open() and c.buf == b""
        await _next_is_answered_in_step(c, up, "the upstream connection stayed in step and was reused")

    _run_with(answer, test, stack)


# -- response framing --------------------------------------------------------------------------
def test_response_with_chunked_and_content_length_is_read_as_chunked(stack: Callable) -> None:
    """Transfer-Encoding overrides Content-Length (RFC 9112 6.3); reading the length instead splits the
    response (response splitting). An intermediary forwarding it must drop the Content-Length."""
    chunked = b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"

    def answer(method: bytes, target: bytes, body: bytes) -> tuple[list[bytes], bool]:
        if target == b"/both":
            return [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n" + chunked], False
        return [_ok(b"next")], False

    async def test(st: Any, up: Upstream) -> None:
        c = await Client.open(st.tap_url)
        await c.send(get(b"/both"))
        r = await c.response()
        assert r.status == 200 and r.body == b"hello world"
        assert r.field(b"transfer-encoding") == b"chunked"
        await c.send(get(b"/next"))
        r2 = await c.response()
        assert r2.status == 200 and r2.body == b"next"
        assert r.field(b"content-length") is None, (
            f"the client got both Transfer-Encoding and Content-Length: {r.head.fields!r}"
        )
        c.close()

    _run_with(answer, test, stack)


def test_chunked_response_with_trailer_fields(stack: Callable) -> None:
    """Trailer fields follow the last chunk; a proxy that treats `0\\r\\n` as the end leaves them in the
    stream, where they are read as the start of the next response. Sent across three reads here."""

    def answer(method: bytes, target: bytes, body: bytes) -> tuple[list[bytes], bool]:
        if target == b"/trailers":
            return [
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Trailer\r\n\r\n5\r\nhello\r\n",
                b"7\r\n, trail\r\n0\r\n",
                b"X-Trailer: v\r\n\r\n",
            ], False
        return [_ok(b"next")], False

    async def test(st: Any, up: Upstream) -> None:
        c = await Client.open(st.tap_url)
        await c.send(get(b"/trailers", b"TE: trailers"))
        r = await c.response()
        assert r.status == 200 and r.body == b"hello, trail"
        assert r.raw.endswith(b"0\r\nX-Trailer: v\r\n\r\n"), r.raw
        await _next_is_answered_in_step(c, up, "the upstream connection was in step after the trailers and reused")

    _run_with(answer, test, stack)


def _sse_event(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def test_injected_stream_with_trailer_fields_is_rechunked_and_terminated(stack: Callable) -> None:
    """With usage injected the tap re-frames the stream itself; trailers after the last chunk (in their
    own read) must still end the client's body exactly once, with a proper last chunk."""
    role = _sse_event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    tok = _sse_event({"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]})
    usage = _sse_event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}})
    done = b"data: [DONE]\n\n"

    def answer(method: bytes, target: bytes, body: bytes) -> tuple[list[bytes], bool]:
        if target == CHAT:
            assert b'"include_usage":true' in body
            return [
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                + http1.chunk(role), http1.chunk(tok), http1.chunk(usage) + http1.chunk(done), b"0\r\n",
                b"X-Trailer: v\r\n\r\n",
            ], False
        return [_ok(b"next")], False

    async def test(st: Any, up: Upstream) -> None:
        c = await Client.open(st.tap_url)
        await c.send(post(CHAT, chat_body(), b"x-request-id: tr"))
        r = await c.response(b"POST")
        assert r.status == 200 and r.body == role + tok + done, r.body
        await c.send(get(b"/next"))
        assert (await c.response()).body == b"next"
        await wait_for(lambda: len(st.records) == 1)
        rec = st.records[0]
        assert rec.outcome == C.OUTCOME_OK and rec.usage_injected
        assert rec.timings.n_out == 4 and rec.timings.usage_source == C.USAGE_SOURCE_ENGINE
        c.close()

    _run_with(answer, test, stack)


def test_http10_upstream_connection_is_not_reused(stack: Callable) -> None:
    """An HTTP/1.0 response without keep-alive means the server will close (RFC 9112 9.3); reusing the
    connection races that close and fails the next request. The upstream here keeps it open
    regardless, so a reuse would show up as two requests on one connection."""

    def answer(method: bytes, target: bytes, body: bytes) -> tuple[list[bytes], bool]:
        payload = b"one-oh " + target
        return [b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)], False

    async def test(st: Any, up: Upstream) -> None:
        c = await Client.open(st.tap_url)
        for i in range(2):
            await c.send(get(b"/r%d" % i))
            r = await c.response()
            assert r.status == 200 and r.body == b"one-oh /r%d" % i
        assert up.connections == [[(b"GET", b"/r0")], [(b"GET", b"/r1")]], "one upstream connection per request"
        assert await c.still_open(), "the upstream's HTTP/1.0 does not cost the HTTP/1.1 client its connection"
        await wait_for(lambda: len(st.server.proxy.pool.live) <= 1)
        assert st.server.proxy.pool._idle == []
        c.close()

    _run_with(answer, test, stack)


# -- large and early answers -------------------------------------------------------------------
@pytest.mark.parametrize("over", [False, True], ids=["under-8MiB", "over-8MiB"])
def test_non_streamed_completion_body_around_the_parse_limit(stack: Callable, over: bool) -> None:
    """A huge non-streamed answer must reach the client intact; past MAX_PARSED_RESPONSE_BYTES the tap
    keeps only the body's tail, where engines write `usage`, so n_out is still the engine's count and
    the request can still count as goodput."""
    limit = relay.MAX_PARSED_RESPONSE_BYTES
    shell = {"id": "cmpl-big", "choices": [{"index": 0, "message": {"role": "assistant", "content": ""},
                                            "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}
    base = len(json.dumps(shell).encode())
    size = limit + 1024 if over else limit - 1024
    shell["choices"][0]["message"]["content"] = "x" * (size - base)
    payload = json.dumps(shell).encode()
    assert len(payload) == size

    def answer(method: bytes, target: bytes, body: bytes) -> tuple[list[bytes], bool]:
        return [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(payload)
                + payload], False

    async def test(st: Any, up: Upstream) -> None:
        c = await Client.open(st.tap_url)
        await c.send(post(CHAT, chat_body(stream=False), b"x-request-id: big"))
        r = await c.response(b"POST")
        assert r.status == 200 and len(r.body) == size and sha(r.body) == hashlib.sha256(payload).hexdigest()
        await wait_for(lambda: len(st.records) == 1)
        rec = st.records[0]
        assert rec.outcome == C.OUTCOME_OK and not rec.streamed and rec.timings.e2e is not None
        assert (rec.timings.n_out, rec.timings.usage_source, rec.good) == (5, C.USAGE_SOURCE_ENGINE, True)
        c.close()

    _run_with(answer, test, stack)


@pytest.mark.parametrize("announce_close", [True, False], ids=["connection-close", "no-connection-close"])
def test_upstream_answering_before_reading_a_large_body_then_closing(stack: Callable, announce_close: bool) -> None:
    """Servers reject an upload from its head (413) and close without reading the rest; the tap is still
    writing the body then, so the close may arrive as a reset. The answer must still reach the client
    and neither the tap nor the client's connection may be left broken. The body is 16 MiB (under the
    tap's 32 MiB limit) because loopback socket buffers swallow a 2 MiB one whole: only a larger one
    is still being written by the tap when the answer arrives."""
    small = b'{"model":"m","messages":[]}'
    big = chat_body(stream=False, messages=[{"role": "user", "content": "y" * (16 << 20)}])
    reject = b'{"error":{"message":"too large","code":413}}'

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = http1.parse_request_head((await reader.readuntil(b"\r\n\r\n"))[:-4])
                length = int(head.get(b"content-length") or 0)
                if length > 65536:  # answer from the head, read none of the body, and close
                    writer.write(
                        b"HTTP/1.1 413 Content Too Large\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
                        % (len(reject), b"Connection: close\r\n" if announce_close else b"", reject)
                    )
                    await writer.drain()
                    return
                await reader.readexactly(length)
                writer.write(_ok(b"small ok"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def go() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            async with stack(upstream_url=url) as st:
                c = await Client.open(st.tap_url)
                await c.send(post(CHAT, big, b"x-request-id: early"))
                r = await c.response(b"POST")
                assert (r.status, r.body) == (413, reject), (r.status, r.body)
                await wait_for(lambda: len(st.records) == 1)
                assert (st.records[0].outcome, st.records[0].status) == (C.OUTCOME_CLIENT_ERROR, 413)
                await c.send(post(CHAT, small, b"x-request-id: same"))  # the same client connection is in step
                assert (await c.response(b"POST")).body == b"small ok"
                c2 = await Client.open(st.tap_url)
                await c2.send(post(CHAT, small, b"x-request-id: fresh"))
                assert (await c2.response(b"POST")).body == b"small ok"
                c.close()
                c2.close()
        finally:
            server.close()

    asyncio.run(go())


# -- pipelining --------------------------------------------------------------------------------
def test_request_pipelined_behind_a_stream_is_answered_after_it(stack: Callable) -> None:
    """A GET sent in the same write as a streaming request waits until the stream has ended; answering
    it early would interleave its bytes into the SSE body."""

    async def go() -> None:
        async with stack() as st:
            c = await Client.open(st.tap_url)
            await c.send(
                post(CHAT, chat_body(), b"x-request-id: pipe", b"x-test-chunks: 5", b"x-test-delay-ms: 20")
                + get(b"/v1/models")
            )
            stream = await c.response(b"POST")
            assert stream.status == 200 and stream.body.endswith(b"data: [DONE]\n\n")
            assert sha(stream.body) == st.upstream.records["pipe"].public()["sha_without_usage"]
            models = await c.response()
            assert models.status == 200 and models.json()["data"][0]["id"] == "chat-a"
            assert c.buf == b"" and await c.still_open()
            await wait_for(lambda: len(st.records) == 1)
            assert st.records[0].outcome == C.OUTCOME_OK and st.records[0].timings.n_out == 5
            c.close()

    asyncio.run(go())


# -- a client leaving early --------------------------------------------------------------------
def test_client_leaving_while_the_tap_connects_upstream(stack: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client can give up before the upstream connection exists. The request is one disconnect, the
    engine never sees it, and the connection that completes afterwards is pooled for the next
    request rather than leaked or left half-used."""
    real_connect = upstream.UpstreamPool.connect
    connects: list[float] = []

    async def slow_connect(self: upstream.UpstreamPool) -> upstream.UpstreamConnection:
        connects.append(asyncio.get_running_loop().time())
        await asyncio.sleep(0.5)
        return await real_connect(self)

    monkeypatch.setattr(upstream.UpstreamPool, "connect", slow_connect)

    async def go() -> None:
        async with stack() as st:
            pool = st.server.proxy.pool
            c = await Client.open(st.tap_url)
            await c.send(post(CHAT, chat_body(), b"x-request-id: gone"))
            await wait_for(lambda: len(connects) == 1)
            c.close()
            await wait_for(lambda: len(st.records) == 1)
            rec = st.records[0]
            assert rec.outcome == C.OUTCOME_CLIENT_DISCONNECTED and rec.request_id == "gone" and not rec.good
            await wait_for(lambda: len(pool._idle) == 1, timeout=2.0)
            await asyncio.sleep(0.05)
            assert len(st.records) == 1, "recorded once"
            assert pool.live == set(pool._idle), "the late connection is idle in the pool, not held by a dead exchange"
            assert pool._idle[0].user is None
            assert st.upstream.requests_seen == 0 and "gone" not in st.upstream.records
            c2 = await Client.open(st.tap_url)
            await c2.send(get(b"/v1/models"))
            assert (await c2.response()).status == 200
            assert len(connects) == 1, "the pooled connection served the next request"
            c2.close()

    asyncio.run(go())


# -- a broken upstream -------------------------------------------------------------------------
def test_malformed_status_line_from_the_upstream_is_a_502(stack: Callable) -> None:
    """A garbled status line means the upstream connection is out of step or not HTTP at all: the client
    gets a 502 it can read, the timed request is an upstream error, and the connection is dropped."""

    def answer(method: bytes, target: bytes, body: bytes) -> tuple[list[bytes], bool]:
        return [b"HTPT/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"], False

    async def test(st: Any, up: Upstream) -> None:
        c = await Client.open(st.tap_url)
        await c.send(post(CHAT, chat_body(stream=False), b"x-request-id: bad"))
        r = await c.response(b"POST")
        assert r.status == 502 and b"malformed" in r.body, (r.status, r.body)
        await wait_for(lambda: len(st.records) == 1)
        assert (st.records[0].outcome, st.records[0].status) == (C.OUTCOME_UPSTREAM_ERROR, 502)
        assert await c.still_open(), "the client's connection is in step: the 502 was complete"
        await c.send(get(b"/v1/models"))
        r = await c.response()
        assert r.status == 502 and b"malformed status line" in r.body
        assert len(up.connections) == 2, "the out-of-step upstream connection was not reused"
        assert st.server.proxy.pool._idle == []
        c.close()

    _run_with(answer, test, stack)
