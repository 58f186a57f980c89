"""The tap as an HTTP/1.1 intermediary, over raw sockets so the framing is exactly what a test writes:
pipelining, keep-alive, HTTP/1.0 clients, chunked uploads, 100-continue, refusals, hop-by-hop
fields, and the body framing it gives each kind of response."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

from exporter.tap import http1, upstream
from exporter.tap.http1 import ResponseHead

T = 3.0  # seconds any single read may take
CHAT = b"/v1/chat/completions"


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@dataclass
class Response:
    head: ResponseHead
    body: bytes  # decoded payload
    raw: bytes  # the body bytes as they came, framing included

    @property
    def status(self) -> int:
        return self.head.status

    def field(self, name: bytes) -> bytes | None:
        return self.head.get(name)

    def json(self) -> Any:
        return json.loads(self.body)


class Client:
    """One raw client connection; reads responses exactly, keeping bytes past one for the next."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.buf = reader, writer, b""

    @classmethod
    async def open(cls, url: str) -> Client:
        parts = urlsplit(url)
        return cls(*await asyncio.open_connection(parts.hostname, parts.port))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def _more(self) -> bytes:
        data = await asyncio.wait_for(self.reader.read(65536), T)
        self.buf += data
        return data

    async def head(self) -> ResponseHead:
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            if not await self._more():
                raise AssertionError(f"EOF inside a response head: {self.buf[:200]!r}")
        head, self.buf = self.buf[:end], self.buf[end + 4 :]
        return http1.parse_response_head(head)

    async def response(self, method: bytes = b"GET") -> Response:
        head = await self.head()
        while head.status < 200:
            head = await self.head()
        framing = http1.response_body_length(head, method)
        if framing == http1.CHUNKED:
            decoder, raw, out = http1.ChunkedDecoder(), [], []
            while not decoder.done:
                if not self.buf and not await self._more():
                    raise AssertionError("EOF inside a chunked body")
                payload, used = decoder.feed(self.buf)
                raw.append(self.buf[:used])
                out.append(payload)
                self.buf = self.buf[used:]
            return Response(head, b"".join(out), b"".join(raw))
        if framing == http1.UNTIL_CLOSE:
            while await self._more():
                pass
            body, self.buf = self.buf, b""
            return Response(head, body, body)
        while len(self.buf) < framing:
            if not await self._more():
                raise AssertionError("EOF inside a Content-Length body")
        body, self.buf = self.buf[:framing], self.buf[framing:]
        return Response(head, body, body)

    async def at_eof(self) -> bool:
        """True when the tap has closed: nothing more arrives and the stream ends."""
        try:
            data = await asyncio.wait_for(self.reader.read(65536), T)
        except ConnectionResetError:
            return True
        assert not data and not self.buf, f"unexpected bytes: {(self.buf + data)[:200]!r}"
        return True

    async def still_open(self) -> bool:
        """No EOF within a short while."""
        try:
            data = await asyncio.wait_for(self.reader.read(1), 0.1)
        except asyncio.TimeoutError:
            return True
        self.buf += data
        return False

    def close(self) -> None:
        self.writer.close()


def get(path: bytes, *fields: bytes, version: bytes = b"1.1") -> bytes:
    return b"GET %s HTTP/%s\r\nHost: tap\r\n%s\r\n" % (path, version, b"".join(f + b"\r\n" for f in fields))


def post(path: bytes, body: bytes, *fields: bytes, version: bytes = b"1.1") -> bytes:
    extra = b"".join(f + b"\r\n" for f in fields)
    return b"POST %s HTTP/%s\r\nHost: tap\r\nContent-Length: %d\r\n%s\r\n%s" % (path, version, len(body), extra, body)


def chat_body(**extra: Any) -> bytes:
    doc = {"model": "chat-a", "stream": True, "messages": [{"role": "user", "content": "hi"}], **extra}
    return json.dumps(doc).encode()


def count_connects(st: Any) -> list[float]:
    """Wraps the tap's pool so each new upstream connection is noted."""
    pool = st.server.proxy.pool
    connects: list[float] = []
    connect = pool.connect

    async def counting() -> Any:
        connects.append(time.monotonic())
        return await connect()

    pool.connect = counting
    return connects


async def wait_for(predicate: Callable[[], bool], timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


# -- connections -------------------------------------------------------------------------------
def with_client(stack: Callable, test: Callable[[Any, Client], Awaitable[None]], **settings: Any) -> None:
    """Runs `test(st, c)` on a tap stack made with `settings` and a client connected to its proxy."""

    async def go() -> None:
        async with stack(**settings) as st:
            await test(st, await Client.open(st.tap_url))

    asyncio.run(go())


async def assert_closed(c: Client, r: Any) -> None:
    """The answer `r` said Connection: close, and the tap then closed the connection."""
    assert (r.field(b"connection") or b"").lower() == b"close"
    assert await c.at_eof()


def test_pipelined_requests_are_answered_in_order_on_one_connection(stack: Callable) -> None:
    """HTTP/1.1 clients may send the next request before the previous answer; the tap must neither
    drop nor reorder them, including one with a body."""

    async def test(st: Any, c: Client) -> None:
        await c.send(get(b"/v1/models") + post(b"/echo/p", b"0123456789") + get(b"/metrics"))
        first, second, third = await c.response(), await c.response(b"POST"), await c.response()
        assert first.status == 200 and first.json()["data"][0]["id"] == "chat-a"
        assert second.status == 200 and second.json()["method"] == "POST" and second.json()["len"] == 10
        assert third.status == 200 and b"vllm:num_requests_running 3.0" in third.body
        assert await c.still_open()
        c.close()

    with_client(stack, test)


def test_sequential_requests_reuse_one_upstream_connection(stack: Callable) -> None:
    """Opening a connection to the engine per request costs a handshake each time (and TLS with https)."""

    async def go() -> None:
        async with stack() as st:
            connects = count_connects(st)
            c = await Client.open(st.tap_url)
            for i in range(5):
                await c.send(get(b"/echo/%d" % i))
                r = await c.response()
                assert r.status == 200 and r.json()["raw_path"] == f"/echo/{i}"
            assert len(connects) == 1
            assert len(st.server.proxy.pool.live) == 1
            c.close()

    asyncio.run(go())


def test_http10_client_gets_a_complete_response_then_close(stack: Callable) -> None:
    async def test(st: Any, c: Client) -> None:
        await c.send(b"GET /v1/models HTTP/1.0\r\n\r\n")
        r = await c.response()
        assert r.status == 200 and r.json()["data"][0]["id"] == "chat-a"
        assert r.field(b"transfer-encoding") is None  # HTTP/1.0 has no chunked coding
        await assert_closed(c, r)

    with_client(stack, test)


def test_http10_client_gets_a_stream_unchunked_then_eof(stack: Callable) -> None:
    """An HTTP/1.0 client cannot decode chunked framing: the SSE bytes go out plain, the end marked by closing."""

    async def test(st: Any, c: Client) -> None:
        await c.send(post(CHAT, chat_body(), b"x-request-id: h10", b"x-test-chunks: 3", version=b"1.0"))
        head = await c.head()
        assert head.status == 200 and head.get(b"transfer-encoding") is None and head.get(b"content-length") is None
        chunks = []
        while data := await asyncio.wait_for(c.reader.read(65536), T):
            chunks.append(data)
        body = c.buf + b"".join(chunks)
        assert body.startswith(b"data: {") and body.endswith(b"data: [DONE]\n\n"), body[:80]
        assert sha(body) == st.upstream.records["h10"].public()["sha_without_usage"]
        await wait_for(lambda: len(st.records) == 1)
        assert st.records[0].outcome == "ok"

    with_client(stack, test)


def test_client_connection_close_is_honoured(stack: Callable) -> None:
    async def test(st: Any, c: Client) -> None:
        await c.send(get(b"/v1/models", b"Connection: close"))
        r = await c.response()
        assert r.status == 200 and r.json()["object"] == "list"
        await assert_closed(c, r)

    with_client(stack, test)


# -- request bodies ----------------------------------------------------------------------------
def test_chunked_upload_reaches_the_upstream_with_a_content_length(stack: Callable) -> None:
    """Engines' servers vary in chunked-upload support; the tap sends the decoded body with its length."""

    async def test(st: Any, c: Client) -> None:
        body = b"5;e=1\r\nhello\r\n6\r\n world\r\nC\r\n from chunks\r\n0\r\n\r\n"
        await c.send(b"POST /echo/x HTTP/1.1\r\nHost: tap\r\nTransfer-Encoding: chunked\r\n\r\n" + body[:9])
        await asyncio.sleep(0.02)
        await c.send(body[9:])
        r = await c.response(b"POST")
        echo = r.json()
        headers = {k.lower(): v for k, v in echo["headers"].items()}
        assert r.status == 200 and echo["len"] == len(b"hello world from chunks")
        assert headers["content-length"] == "23" and "transfer-encoding" not in headers
        await c.send(get(b"/echo/after"))  # the connection is in step after the chunked body
        assert (await c.response()).json()["raw_path"] == "/echo/after"

    with_client(stack, test)


def test_expect_100_continue(stack: Callable) -> None:
    """Clients that send Expect: 100-continue wait for the interim answer before uploading."""

    async def test(st: Any, c: Client) -> None:
        await c.send(b"POST /echo/e HTTP/1.1\r\nHost: tap\r\nContent-Length: 11\r\nExpect: 100-continue\r\n\r\n")
        interim = await c.head()
        assert interim.status == 100 and interim.reason == b"Continue"
        await c.send(b"hello world")
        r = await c.response(b"POST")
        assert r.status == 200 and r.json()["len"] == 11
        assert "expect" not in {k.lower() for k in r.json()["headers"]}, "the tap already answered the expectation"

    with_client(stack, test)


def test_expect_100_continue_with_an_oversized_body_gets_413_only(stack: Callable) -> None:
    async def test(st: Any, c: Client) -> None:
        await c.send(b"POST /v1/completions HTTP/1.1\r\nHost: tap\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n")
        r = await c.response(b"POST")
        assert r.status == 413 and b"limit of 100 bytes" in r.body
        assert await c.at_eof()
        assert st.upstream.requests_seen == 0

    with_client(stack, test, max_body_bytes=100)


# -- refusals ----------------------------------------------------------------------------------
def test_malformed_request_line_gets_400_with_a_reason_and_close(stack: Callable) -> None:
    async def test(st: Any, c: Client) -> None:
        await c.send(b"GET /v1/models\r\nHost: tap\r\n\r\n")
        r = await c.response()
        assert r.status == 400 and b"malformed request line" in r.body, r.body
        await assert_closed(c, r)

    with_client(stack, test)


def test_a_control_character_in_the_target_gets_400_and_never_reaches_the_engine(stack: Callable) -> None:
    async def test(st: Any, c: Client) -> None:
        await c.send(b"GET /v1/models\x1b[2J HTTP/1.1\r\nHost: tap\r\n\r\n")
        r = await c.response()
        assert r.status == 400 and b"request target" in r.body, r.body
        await assert_closed(c, r)
        assert st.upstream.requests_seen == 0

    with_client(stack, test)


def test_request_head_over_64k_gets_431_while_it_arrives(stack: Callable) -> None:
    async def test(st: Any, c: Client) -> None:
        await c.send(b"GET /v1/models HTTP/1.1\r\nHost: tap\r\nX-Big: " + b"a" * (http1.MAX_HEAD_BYTES + 1000))
        r = await c.response()
        assert r.status == 431 and b"larger than" in r.body
        assert await c.at_eof()

    with_client(stack, test)


def test_complete_request_head_over_64k_gets_431(stack: Callable) -> None:
    """The head limit must not depend on whether the head's end arrived in the same read."""

    async def test(st: Any, c: Client) -> None:
        fields = b"".join(b"X-Big-%d: %s\r\n" % (i, b"a" * 4000) for i in range(20))  # 80 KB in short lines
        head = b"GET /echo/big HTTP/1.1\r\nHost: tap\r\n" + fields + b"\r\n"
        await c.send(head[:60_000])  # under the limit, no end yet
        await asyncio.sleep(0.05)
        await c.send(head[60_000:])  # crosses the limit and ends the head in one read
        r = await c.response()
        assert r.status == 431, (r.status, r.body[:200])

    with_client(stack, test)


@pytest.mark.parametrize(
    "framing",
    [
        b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
        b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        b"Content-Length: 5\r\nContent-Length: 6\r\n",
        b"Transfer-Encoding: gzip, chunked\r\n",
        b"Transfer-Encoding : chunked\r\nContent-Length: 5\r\n",
    ],
)
def test_ambiguous_request_framing_is_refused_before_the_upstream_sees_it(stack: Callable, framing: bytes) -> None:
    """If the tap and the engine disagree on where a body ends, a request hidden in the body reaches the
    engine unseen (request smuggling); the tap refuses rather than pick one reading."""

    async def test(st: Any, c: Client) -> None:
        smuggled = b"POST /v1/completions HTTP/1.1\r\nHost: tap\r\nContent-Length: 2\r\n\r\n{}"
        await c.send(b"POST /v1/completions HTTP/1.1\r\nHost: tap\r\n" + framing + b"\r\n0\r\n\r\n" + smuggled)
        r = await c.response(b"POST")
        assert r.status == 400 and b"malformed request" in r.body
        assert await c.at_eof()
        await asyncio.sleep(0.05)
        assert st.upstream.requests_seen == 0 and st.records == []

    with_client(stack, test)


# -- fields ------------------------------------------------------------------------------------
def test_hop_by_hop_request_fields_are_not_forwarded(stack: Callable) -> None:
    """Connection-specific fields (RFC 9110 7.6.1), including those the Connection field names, stop at the tap."""

    async def test(st: Any, c: Client) -> None:
        await c.send(get(
            b"/echo/h?a=%2F", b"Connection: keep-alive, X-Drop-Me", b"X-Drop-Me: 1", b"Keep-Alive: 5", b"TE: trailers",
            b"Proxy-Connection: keep-alive", b"X-Custom: kept", b"Upgrade: h2c",
        ))
        r = await c.response()
        echo = r.json()
        headers = {k.lower(): v for k, v in echo["headers"].items()}
        for name in ("x-drop-me", "keep-alive", "te", "proxy-connection", "upgrade"):
            assert name not in headers, name
        assert headers["x-custom"] == "kept"
        assert headers["host"] == urlsplit(st.upstream_url).netloc, "Host names the upstream"
        assert echo["raw_path"] == "/echo/h?a=%2F", "the target is relayed as sent"
        assert r.field(b"x-echo") == b"1"
        assert await c.still_open(), "Connection: keep-alive from the client was answered with keep-alive"

    with_client(stack, test)


# -- response framing --------------------------------------------------------------------------
def test_stream_with_injected_usage_is_rechunked_without_it(stack: Callable) -> None:
    async def test(st: Any, c: Client) -> None:
        await c.send(post(CHAT, chat_body(), b"x-request-id: s1", b"x-test-chunks: 4"))
        r = await c.response(b"POST")
        sent = st.upstream.records["s1"].public()
        assert r.status == 200 and r.field(b"transfer-encoding") == b"chunked" and r.field(b"content-length") is None
        assert sent["include_usage"], "the tap asked for usage"
        assert b'"usage"' not in r.body and r.body.endswith(b"data: [DONE]\n\n")
        assert sha(r.body) == sent["sha_without_usage"] != sent["sha_all"]
        await c.send(get(b"/v1/models"))  # still in step after the re-framed body
        assert (await c.response()).status == 200

    with_client(stack, test)


async def _recording_forwarder(target_url: str, seen: list[bytes]) -> tuple[asyncio.AbstractServer, str]:
    """A TCP relay to target_url that keeps every byte sent back towards the tap."""
    parts = urlsplit(target_url)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, record: bool) -> None:
        try:
            while data := await reader.read(65536):
                if record:
                    seen.append(data)
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection(parts.hostname, parts.port)
        await asyncio.gather(pipe(cr, uw, False), pipe(ur, cw, True))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def test_stream_whose_client_asked_usage_keeps_the_upstream_framing_byte_for_byte(stack: Callable) -> None:
    """An unchanged body is relayed as the very bytes that arrived, chunk boundaries included."""

    async def go() -> None:
        async with stack() as base:
            seen: list[bytes] = []
            fwd, fwd_url = await _recording_forwarder(base.upstream_url, seen)
            try:
                async with stack(upstream_url=fwd_url) as st:
                    c = await Client.open(st.tap_url)
                    body = chat_body(stream_options={"include_usage": True})
                    await c.send(post(CHAT, body, b"x-request-id: s2", b"x-test-chunks: 4"))
                    r = await c.response(b"POST")
                    c.close()
            finally:
                fwd.close()
            sent = base.upstream.records["s2"].public()
            assert r.status == 200 and r.field(b"transfer-encoding") == b"chunked"
            assert b'"usage":{' in r.body and sha(r.body) == sent["sha_all"]
            upstream_bytes = b"".join(seen)
            upstream_body = upstream_bytes[upstream_bytes.index(b"\r\n\r\n") + 4 :]
            assert r.raw == upstream_body, "the client got the upstream's chunked framing unchanged"
            assert r.raw.count(b"\r\ndata: ") >= 6, "several chunks, not one re-chunked blob"

    asyncio.run(go())


@asynccontextmanager
async def _close_delimited_upstream(payload: bytes) -> AsyncIterator[tuple[str, list[bytes]]]:
    """An upstream that answers every request with a body ended by closing the connection, while the block
    runs: its URL, and the request heads it has read."""
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + payload)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", requests
    finally:
        server.close()


def test_close_delimited_upstream_body_is_rechunked_and_the_client_connection_kept(stack: Callable) -> None:
    """Passing the close on would cost the client its connection; the tap frames the body itself."""

    async def go() -> None:
        async with _close_delimited_upstream(b"hello world") as (url, requests), stack(upstream_url=url) as st:
            c = await Client.open(st.tap_url)
            for i in range(2):
                await c.send(get(b"/plain/%d" % i))
                r = await c.response()
                assert r.status == 200 and r.field(b"transfer-encoding") == b"chunked", r.head
                assert r.field(b"connection") is None and r.body == b"hello world"
            assert len(requests) == 2, "a close-delimited connection is not reused"
            assert await c.still_open()
            c.close()

    asyncio.run(go())


def test_close_delimited_upstream_body_to_http10_client(stack: Callable) -> None:
    async def go() -> None:
        async with _close_delimited_upstream(b"plain text") as (url, _), stack(upstream_url=url) as st:
            c = await Client.open(st.tap_url)
            await c.send(get(b"/plain", version=b"1.0"))
            r = await c.response()
            assert r.status == 200 and r.field(b"transfer-encoding") is None and r.body == b"plain text"
            assert await c.at_eof()

    asyncio.run(go())


def test_idle_upstream_connections_expire(stack: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    """Engines close idle keep-alive connections (uvicorn after 5 s); reusing one as it closes fails a request."""
    monkeypatch.setattr(upstream, "IDLE_TIMEOUT_S", 0.05)

    async def go() -> None:
        async with stack() as st:
            connects = count_connects(st)
            pool = st.server.proxy.pool
            c = await Client.open(st.tap_url)
            await c.send(get(b"/echo/1"))
            assert (await c.response()).status == 200
            (first,) = pool.live
            await asyncio.sleep(0.1)
            await c.send(get(b"/echo/2"))
            assert (await c.response()).status == 200
            assert len(connects) == 2, "a new upstream connection after the idle timeout"
            await wait_for(lambda: first.closed)
            assert first not in pool.live and len(pool.live) == 1
            c.close()

    asyncio.run(go())


def test_idle_client_connections_are_closed_but_busy_ones_are_not(stack: Callable) -> None:
    """Idle keep-alive clients (or ones stalled mid-head) must not pile up on a long-lived sidecar."""

    async def go() -> None:
        async with stack(client_idle_timeout_s=0.3) as st:
            idle, stalled, busy = [await Client.open(st.tap_url) for _ in range(3)]
            await idle.send(get(b"/v1/models"))
            assert (await idle.response()).head.status == 200
            await stalled.send(b"GET /v1/models HTTP/1.1\r\nHost: t")  # a head that never ends
            # A stream that lasts longer than the idle timeout, while the client sends nothing.
            await busy.send(post(CHAT, chat_body(), b"x-test-chunks: 8", b"x-test-delay-ms: 100"))
            started = time.monotonic()
            assert await idle.at_eof() and await stalled.at_eof()
            assert time.monotonic() - started < 2.0
            response = await busy.response(b"POST")
            assert response.body.endswith(b"data: [DONE]\n\n") and await busy.still_open()
            for c in (idle, stalled, busy):
                c.close()

    asyncio.run(go())


def test_idle_pool_sheds_connections_the_engine_closed_and_expires_the_rest(stack: Callable,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """After a burst, the least recently used idle connections must not linger dead in the pool: once it
    held MAX_IDLE of them it would stop pooling and every request would pay a connect."""

    async def go() -> None:
        async with stack() as st:
            pool = st.server.proxy.pool
            clients = [await Client.open(st.tap_url) for _ in range(4)]
            for c in clients:  # four requests in flight at once: four upstream connections
                await c.send(get(b"/echo/burst"))
            for c in clients:
                assert (await c.response()).status == 200
            await wait_for(lambda: len(pool._idle) == 4)
            oldest = pool._idle[0]
            assert oldest.transport is not None
            oldest.transport.abort()  # the engine closes one idle connection
            await wait_for(lambda: oldest not in pool._idle)
            assert len(pool._idle) == 3 and oldest not in pool.live
            monkeypatch.setattr(upstream, "IDLE_TIMEOUT_S", 0.0)
            assert pool.close_expired() == 3 and pool._idle == []
            await wait_for(lambda: not pool.live)
            for c in clients:
                c.close()

    asyncio.run(go())
