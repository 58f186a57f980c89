"""One client's connection to the tap: an asyncio protocol that reads requests one at a time.

It reads a request head and body (exporter.tap.http1 frames them, without I/O), enforces what a
client controls (head size and time, body size, the tap-wide memory for bodies), and hands each
complete request to an Exchange (exporter.tap.exchange), which forwards it and relays the
response. While an exchange runs, pipelined bytes wait; once the upstream switches protocols
(101), bytes pass both ways unparsed. Flow control is exporter.tap.flow's. What the connections
share (exporter.tap.proxy.TapProxy) is reached through `Host`, which builds each request's exchange;
the exchange reaches this connection only through the `Client` it is handed.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable
from typing import Protocol

from exporter.tap import http1
from exporter.tap.exchange import Client, Exchange
from exporter.tap.flow import FlowControl
from exporter.tap.http1 import BadMessage, RequestHead
from exporter.tap.settings import TapSettings
from llmslo import conventions as C

LINGER_S = 2.0  # after refusing a request, how long unread upload bytes are drained before closing
# Decoding a chunked body is Python work per chunk: 32 KiB of 1-byte chunks is about 5,500 of
# them, 7 ms here. Decoding more than this per turn of the loop would starve every stream the tap
# relays (30 MB of 1-byte chunks in one go froze them all for seconds).
BODY_SLICE_BYTES = 32 * 1024


class ConnState(enum.Enum):
    """Where a client connection is."""

    HEAD = "head"  # waiting for (or reading) a request head
    BODY = "body"  # reading a request body
    BUSY = "busy"  # an exchange is relaying the response; pipelined bytes wait
    DRAIN = "drain"  # refused: what the client still sends is read and discarded until the close
    TUNNEL = "tunnel"  # switched protocols: bytes pass both ways unparsed


_READING = (ConnState.HEAD, ConnState.BODY)


class Host(Protocol):
    """What a client connection needs of what the tap's connections share (exporter.tap.proxy.TapProxy)."""

    settings: TapSettings
    connections: set[ClientConnection]
    accepting: bool  # False while draining: a finished exchange closes its connection
    buffered_body_bytes: int  # request bodies held now, on every connection together
    clock: Callable[[], float]

    def refused(self, reason: str) -> None: ...

    def release_body(self, n: int) -> None: ...

    def exchange(self, client: Client, head: RequestHead, body: bytes | bytearray, has_body: bool, arrival: float,
                 reserved: int) -> Exchange: ...


class ClientConnection(asyncio.Protocol):
    """One client's connection: reads requests one at a time and runs an Exchange for each."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.transport: asyncio.Transport | None = None
        self.state = ConnState.HEAD
        self.buf = b""
        self.arrival = 0.0
        self.head: RequestHead | None = None
        self.body_left = 0  # with a Content-Length body: bytes still to read
        self.body = bytearray()
        self.body_size = 0
        self.reserved = 0  # bytes of host.buffered_body_bytes this connection's body holds
        self.decoder: http1.ChunkedDecoder | None = None  # with a chunked body
        self.exchange: Exchange | None = None
        self.last_activity = host.clock()
        # When the head of the request being received had to start arriving (None: idle between requests).
        self.head_started: float | None = self.last_activity
        self._advancing = False
        self._slice_pending = False  # a chunked body is being decoded a slice per turn of the loop
        self.flow: FlowControl  # set once connected
        self.client: Client  # what its exchanges are handed of it, set once connected
        self._linger: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.flow = FlowControl(transport)  # type: ignore[arg-type]
        self.client = Client(self.write, self.flow, self.exchange_done, self.abort, self.start_tunnel, self._peer)
        host = self.host
        if len(host.connections) >= host.settings.max_connections:
            host.refused(C.REFUSED_CONNECTION_LIMIT)
            self.refuse(503, f"the tap is at its limit of {host.settings.max_connections} client connections; "
                        "retry shortly\n", retry_after=1)
            return
        host.connections.add(self)

    def data_received(self, data: bytes) -> None:
        state = self.state
        if state is ConnState.TUNNEL:
            if self.exchange is not None:
                self.exchange.to_upstream(data)
            return
        if state is ConnState.DRAIN:
            return
        now = self.last_activity = self.host.clock()
        if state is not ConnState.BODY and not self.buf:
            self.arrival = now  # the first bytes of a request (pipelined ones may come while busy)
            if self.head_started is None and state is ConnState.HEAD:
                self.head_started = now
        self.buf = self.buf + data if self.buf else data
        if state is ConnState.BUSY:
            # Pipelined bytes wait for the current response; a flood of them stops reading.
            if len(self.buf) > http1.MAX_HEAD_BYTES:
                self.flow.pause_reading()
            return
        self._advance()

    def eof_received(self) -> bool:
        return False  # a client that stops sending mid-exchange has gone: close, and cancel upstream

    def connection_lost(self, exc: Exception | None) -> None:
        self.host.connections.discard(self)
        self._release_body()
        if self._linger is not None:
            self._linger.cancel()
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.client_lost()

    def pause_writing(self) -> None:
        self.flow.write_paused = True
        if self.exchange is not None:
            self.exchange.pause_upstream()

    def resume_writing(self) -> None:
        self.flow.write_paused = False
        if self.exchange is not None:
            self.exchange.resume_upstream()

    def check_deadlines(self, now: float) -> None:
        """Called every tick: the head deadline here, the upstream deadlines in the exchange."""
        if self.exchange is not None:
            self.exchange.check_deadline(now)
        elif self.state is ConnState.HEAD and self.head_started is not None:
            if now - self.head_started > self.host.settings.head_timeout_s:
                self.host.refused(C.REFUSED_HEAD_TIMEOUT)
                self.refuse(408, f"the request head did not arrive within {self.host.settings.head_timeout_s:g} s\n")

    # -- requests --------------------------------------------------------------------------
    def _advance(self) -> None:
        """Parse as far as the buffered bytes allow; start the exchange for a complete request."""
        if self._advancing:
            return
        self._advancing = True
        try:
            while self.state in _READING and self.buf and not self._slice_pending:
                if self.state is ConnState.HEAD and not self._read_head():
                    return
                if self.state is ConnState.BODY and not self._read_body():
                    return
        except BadMessage as e:
            self.host.refused(C.REFUSED_MALFORMED)
            self.refuse(400, f"malformed request: {e}\n")
        finally:
            self._advancing = False

    def _read_head(self) -> bool:
        end = self.buf.find(http1.HEAD_END)
        if end > http1.MAX_HEAD_BYTES or (end < 0 and len(self.buf) > http1.MAX_HEAD_BYTES):
            self.host.refused(C.REFUSED_HEAD_TOO_LARGE)
            self.refuse(431, f"request head larger than {http1.MAX_HEAD_BYTES} bytes\n")
            return False
        if end < 0:
            return False
        head = http1.parse_request_head(self.buf[:end])
        self.buf = self.buf[end + 4 :]
        length = http1.request_body_length(head)
        if length is not None and length > self.host.settings.max_body_bytes:
            self._refuse_body()
            return False
        if length and not self._reserve(length):
            return False
        self.head = head
        self.head_started = None
        self.body, self.body_size = (bytearray(length) if length else bytearray()), 0
        self.body_left = length or 0
        self.decoder = http1.ChunkedDecoder() if length is None else None
        if (length is None or length > 0) and not self.buf and (head.get(b"expect") or b"").lower() == b"100-continue":
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.state = ConnState.BODY
        if length == 0:
            self._start()
        return True

    def _reserve(self, n: int) -> bool:
        """Count n more body bytes against the tap-wide cap; refuse the request (503) when over it."""
        host = self.host
        if host.buffered_body_bytes + n > host.settings.max_buffered_body_bytes:
            host.refused(C.REFUSED_BODY_MEMORY)
            self.refuse(503, "the tap holds too many request bodies right now; retry shortly\n", retry_after=1)
            return False
        host.buffered_body_bytes += n
        self.reserved += n
        return True

    def _release_body(self) -> None:
        if self.reserved:
            self.host.release_body(self.reserved)
            self.reserved = 0
        self.body = bytearray()

    def _read_body(self) -> bool:
        buf = self.buf
        if self.decoder is not None:
            piece = buf if len(buf) <= BODY_SLICE_BYTES else buf[:BODY_SLICE_BYTES]
            began = time.perf_counter()
            payload, used = self.decoder.feed(piece)
            self.buf = buf[used:]
            if payload:
                if self.body_size + len(payload) > self.host.settings.max_body_bytes:
                    self._refuse_body()
                    return False
                if not self._reserve(len(payload)):
                    return False
                self.body += payload
                self.body_size += len(payload)
            if not self.decoder.done:
                if self.buf:
                    self._yield_slice(time.perf_counter() - began)
                return False
        else:
            take = min(self.body_left, len(buf))
            pos = self.body_size
            self.body[pos : pos + take] = buf if take == len(buf) else buf[:take]
            self.body_size += take
            self.buf = buf[take:]
            self.body_left -= take
            if self.body_left:
                return False
        self._start()
        return True

    def _yield_slice(self, spent: float) -> None:
        """Let the loop relay other streams before the next slice of this body is decoded: after
        as long again as this slice took, so one body's decoding takes at most half of the tap's
        core however its client frames it (measured: 1-byte chunks otherwise take a whole core,
        and the streams wait whenever the machine's other cores are busy)."""
        self._slice_pending = True
        self.flow.pause_reading()
        asyncio.get_running_loop().call_later(spent, self._next_slice)

    def _next_slice(self) -> None:
        self._slice_pending = False
        if self.state is not ConnState.BODY:
            return
        self._advance()
        if not self._slice_pending and self.state is ConnState.BODY:
            self.flow.resume_reading()

    def _start(self) -> None:
        head = self.head
        assert head is not None
        body = self.body if self.body_size == len(self.body) else self.body[: self.body_size]
        has_body = self.decoder is not None or head.get(b"content-length") is not None
        self.head, self.body = None, bytearray()
        reserved, self.reserved = self.reserved, 0  # the exchange holds the body now
        self.state = ConnState.BUSY
        arrival = self.arrival
        if self.buf:
            self.arrival = self.host.clock()  # a pipelined request that is already here
        self.exchange = self.host.exchange(self.client, head, body, has_body, arrival, reserved)
        self.exchange.start()

    def start_tunnel(self) -> None:
        """The upstream switched protocols: from now on bytes pass both ways unparsed."""
        self.state = ConnState.TUNNEL
        buf, self.buf = self.buf, b""
        self.flow.resume_reading()
        if buf and self.exchange is not None:
            self.exchange.to_upstream(buf)

    def exchange_done(self, close: bool) -> None:
        """Called by the exchange once its response is complete (or could not be given)."""
        self.exchange = None
        self.last_activity = self.host.clock()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if close or not self.host.accepting:
            transport.close()
            return
        self.state = ConnState.HEAD
        self.head_started = self.last_activity if self.buf else None  # a pipelined head is already arriving
        self.flow.resume_reading()
        if self.buf:
            self._advance()

    def _refuse_body(self) -> None:
        self.host.refused(C.REFUSED_BODY_TOO_LARGE)
        self.refuse(413, f"request body larger than the tap's limit of {self.host.settings.max_body_bytes} bytes\n")

    def refuse(self, status: int, text: str, retry_after: int | None = None) -> None:
        """Answer with the tap's own error and close, draining what the client is still uploading.

        Closing a socket with unread bytes makes the kernel send a reset, which can destroy the
        answer before the client reads it; so the tap half-closes and discards input for a while.
        """
        transport = self.transport
        self.state, self.buf = ConnState.DRAIN, b""
        self._release_body()
        self.flow.resume_reading()  # discard what the client still sends, rather than leave it unread
        if transport is None or transport.is_closing():
            return
        transport.write(http1.simple_response(status, text, close=True, retry_after=retry_after))
        if transport.can_write_eof():
            transport.write_eof()
            self._linger = asyncio.get_running_loop().call_later(LINGER_S, transport.close)
        else:
            transport.close()

    def _peer(self) -> object:
        transport = self.transport
        return transport.get_extra_info("peername") if transport is not None else None

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

