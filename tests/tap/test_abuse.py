"""No client can break or bloat the tap: heads have a total deadline, connections a cap, request bodies
a tap-wide memory cap, and decoding a body of tiny chunks yields to the other streams."""

from __future__ import annotations

import asyncio
import json
import resource
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from exporter.tap.cli import default_max_connections, raise_fd_limit
from llmslo import conventions as C
from tests.tap.test_faults import body

CHAT = "/v1/chat/completions"



def hostport(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


async def read_all(reader: asyncio.StreamReader, timeout: float = 5.0) -> bytes:
    return await asyncio.wait_for(reader.read(), timeout)


def test_a_trickled_head_is_cut_at_the_head_deadline(stack: Callable) -> None:
    """One byte every 50 ms would reset an idle timeout forever; the head deadline is total."""

    async def go() -> None:
        async with stack(head_timeout_s=0.5) as st:
            reader, writer = await asyncio.open_connection(*hostport(st.tap_url))
            t0 = time.monotonic()
            head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: tap\r\nX-Padding: " + b"a" * 200
            answer = b""
            for byte in head:
                if reader.at_eof():
                    break
                writer.write(bytes([byte]))
                try:
                    answer += await asyncio.wait_for(reader.read(4096), 0.05)
                except (asyncio.TimeoutError, ConnectionError):
                    continue
                if answer:
                    break
            answer += await read_all(reader)
            took = time.monotonic() - t0
            writer.close()
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:60]
            assert 0.5 <= took < 3.0
            assert st.value(C.TAP_REFUSALS.name, reason=C.REFUSED_HEAD_TIMEOUT) == 1
            # A prompt client on a fresh connection is unaffected.
            async with aiohttp.ClientSession() as s, s.post(st.tap_url + CHAT, data=body()) as r:
                assert r.status == 200 and b"[DONE]" in await r.read()

    asyncio.run(go())


def test_a_kept_alive_connection_idles_between_requests_without_the_head_deadline(stack: Callable) -> None:
    """The head deadline starts with a request's first byte, not at the end of the previous response."""

    async def go() -> None:
        async with stack(head_timeout_s=0.3) as st:
            async with aiohttp.ClientSession() as s:
                for _ in range(2):
                    async with s.post(st.tap_url + CHAT, data=body()) as r:
                        assert r.status == 200
                        await r.read()
                    await asyncio.sleep(0.6)
            assert st.value(C.TAP_REFUSALS.name, reason=C.REFUSED_HEAD_TIMEOUT) == 0
            assert len(st.records) == 2

    asyncio.run(go())


def test_connections_over_the_cap_are_refused_with_503(stack: Callable) -> None:
    async def go() -> None:
        async with stack(max_connections=4, head_timeout_s=30) as st:
            held = [await asyncio.open_connection(*hostport(st.tap_url)) for _ in range(4)]
            await asyncio.sleep(0.05)
            reader, writer = await asyncio.open_connection(*hostport(st.tap_url))
            answer = await read_all(reader)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in answer and b"limit of 4" in answer
            assert st.value(C.TAP_REFUSALS.name, reason=C.REFUSED_CONNECTION_LIMIT) == 1
            for _, w in held[:2]:
                w.close()
            await asyncio.sleep(0.1)
            async with aiohttp.ClientSession() as s, s.post(st.tap_url + CHAT, data=body()) as r:
                assert r.status == 200 and b"[DONE]" in await r.read()
            for _, w in held[2:]:
                w.close()

    asyncio.run(go())


def test_bodies_over_the_tap_wide_cap_get_503_and_the_count_returns_to_zero(stack: Callable) -> None:
    async def go() -> None:
        async with stack(max_buffered_body_bytes=1_000_000) as st:
            proxy = st.server.proxy
            big = body(padding="x" * 700_000)
            reader, writer = await asyncio.open_connection(*hostport(st.tap_url))
            writer.write(b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % (CHAT.encode(), len(big)) + big[:1000])
            await writer.drain()
            await asyncio.sleep(0.1)
            assert proxy.buffered_body_bytes == len(big)  # reserved for the whole announced body
            async with aiohttp.ClientSession() as s:
                async with s.post(st.tap_url + CHAT, data=body(padding="y" * 400_000)) as r:
                    assert r.status == 503 and r.headers["Retry-After"] == "1"
                # A small one still fits beside the first.
                async with s.post(st.tap_url + CHAT, data=body()) as r:
                    assert r.status == 200
                    await r.read()
                writer.write(big[1000:])
                await writer.drain()
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                assert head.startswith(b"HTTP/1.1 200")
                writer.close()
                await asyncio.sleep(0.1)
                assert proxy.buffered_body_bytes == 0
                async with s.post(st.tap_url + CHAT, data=body(padding="y" * 400_000)) as r:
                    assert r.status == 200
                    await r.read()
            assert st.value(C.TAP_REFUSALS.name, reason=C.REFUSED_BODY_MEMORY) == 1
            # Clients that leave mid-upload give their reservation back too.
            reader, writer = await asyncio.open_connection(*hostport(st.tap_url))
            writer.write(b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: 900000\r\n\r\nabc" % CHAT.encode())
            await writer.drain()
            await asyncio.sleep(0.1)
            assert proxy.buffered_body_bytes == 900_000
            writer.close()
            await asyncio.sleep(0.2)
            assert proxy.buffered_body_bytes == 0

    asyncio.run(go())


def test_a_body_of_one_byte_chunks_is_decoded_in_slices_and_arrives_whole(stack: Callable) -> None:
    """300 kB of 1-byte chunks (1.8 MB on the wire): the loop runs other work between slices."""

    async def go() -> None:
        from exporter.tap import connection as proxy_mod

        async with stack() as st:
            payload = body(stream=False, padding="z" * 300_000)
            wire = b"".join(b"1\r\n%c\r\n" % b for b in payload) + b"0\r\n\r\n"
            slices = 0
            original = proxy_mod.ClientConnection._next_slice

            def counting(self: Any) -> None:
                nonlocal slices
                slices += 1
                original(self)

            ticks = 0
            loop = asyncio.get_running_loop()

            def tick() -> None:  # a timer due every millisecond: it only runs between slices
                nonlocal ticks
                ticks += 1
                handle[0] = loop.call_later(0.001, tick)

            handle = [loop.call_later(0.001, tick)]
            proxy_mod.ClientConnection._next_slice = counting  # type: ignore[method-assign]
            try:
                reader, writer = await asyncio.open_connection(*hostport(st.tap_url))
                writer.write(b"POST /echo/x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + wire)
                await writer.drain()
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                echoed = json.loads(await reader.readexactly(length))
                writer.close()
            finally:
                proxy_mod.ClientConnection._next_slice = original  # type: ignore[method-assign]
                handle[0].cancel()
            assert echoed["len"] == len(payload)
            assert slices >= len(wire) // proxy_mod.BODY_SLICE_BYTES // 2  # sliced, not decoded a read at a time
            assert ticks >= slices // 2  # timers ran between the slices

    asyncio.run(go())


def test_chunked_bodies_survive_slicing_byte_for_byte(stack: Callable) -> None:
    async def go() -> None:
        async with stack() as st:
            payload = body(stream=False, padding="".join(chr(32 + i % 90) for i in range(300_000)))
            # Chunk sizes that straddle slice boundaries at many offsets.
            parts, i, size = [], 0, 1
            while i < len(payload):
                parts.append(payload[i : i + size])
                i += size
                size = size * 7 % 70_001 + 1
            wire = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
            async with aiohttp.ClientSession() as s:
                async with s.post(st.tap_url + CHAT, data=payload, headers={"x-request-id": "whole"}) as r:
                    await r.read()
            reader, writer = await asyncio.open_connection(*hostport(st.tap_url))
            writer.write(b"POST %s HTTP/1.1\r\nHost: t\r\nx-request-id: sliced\r\nTransfer-Encoding: chunked\r\n\r\n"
                         % CHAT.encode() + wire)
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200")
            writer.close()
            assert len(parts) > 10
            assert st.upstream.records["sliced"].body == st.upstream.records["whole"].body == payload.decode()

    asyncio.run(go())


def test_fd_soft_limit_is_raised_to_the_hard_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
        now = raise_fd_limit()
        assert now == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert now == (hard if hard != resource.RLIM_INFINITY else max(1024, 1 << 20))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert default_max_connections(20_000) == (20_000 - 128) // 2
