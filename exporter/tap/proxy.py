"""The goodput tap: an HTTP/1.1 reverse proxy that relays bytes unchanged and times completions.

Built on bare asyncio protocols rather than a web framework: the tap sits in the path of
every token, and a framework's per-request objects and per-write coroutines were most of the
latency it added. Each client connection (`ClientConnection`) reads requests; each request
becomes an `Exchange` that forwards it on a pooled upstream connection and relays the
response as its bytes arrive, from the upstream's `data_received` straight to the client's
transport. A body the tap does not change goes out as the very bytes that came in, chunked
framing included. Backpressure is the transports' own: a client whose socket buffer fills
pauses reading from the upstream, so the engine's send blocks instead of the tap's memory
growing.

Only POST /v1/chat/completions and /v1/completions are timed; everything else (/metrics,
/v1/models, /health, ...) passes through untouched. For a streamed completion whose client
did not ask for usage, the tap asks the upstream for it (`stream_options.include_usage`) so
n_out is the engine's token count, and takes the extra event out again before the client
sees it (exporter.tap.relay). Request and response contents are never logged or stored.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.tap import http1
from exporter.tap.classes import Objective, SloConfig
from exporter.tap.deadlines import Deadlines, derive_deadlines
from exporter.tap.http1 import CHUNKED, UNTIL_CLOSE, BadMessage, RequestHead, ResponseHead
from exporter.tap.metrics import TapMetrics
from exporter.tap.relay import BodyRelay, Relay, SseRelay
from exporter.tap.request_fields import RequestFields, read_fields
from exporter.tap.timing import RequestTiming, Timings, gave_up, plausible_usage, within_objectives
from exporter.tap.upstream import UpstreamConnection, UpstreamPool
from llmslo import conventions as C

if TYPE_CHECKING:
    from exporter.tap.admission import Admission

log = logging.getLogger("llmslo.tap")

TIMED_PATHS = frozenset({b"/v1/chat/completions", b"/v1/completions"})
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
# Every request body being received or handed to the engine, together: 16 concurrent uploads of
# 31 MB would otherwise hold half a gigabyte. Four such bodies fit at once; more wait for a 503.
DEFAULT_MAX_BUFFERED_BODY_BYTES = 128 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS = 4096  # the CLI derives its default from the file-descriptor limit instead
# A request head must arrive whole within this long (from the connection's accept, or from its first
# byte on a kept-alive connection): trickling bytes do not extend it (slowloris). nginx: 60 s per read.
DEFAULT_HEAD_TIMEOUT_S = 10.0
LINGER_S = 2.0  # after refusing a request, how long unread upload bytes are drained before closing
# Decoding a chunked body is Python work per chunk: 32 KiB of 1-byte chunks is about 5,500 of
# them, 7 ms here. Decoding more than this per turn of the loop would starve every stream the tap
# relays (30 MB of 1-byte chunks in one go froze them all for seconds).
BODY_SLICE_BYTES = 32 * 1024
_DROP_REQUEST = http1.HOP_BY_HOP | {b"host", b"content-length", b"expect"}
_UPSTREAM_FAILURES = (OSError, asyncio.TimeoutError, ssl.SSLError)
_REASONS = {
    400: "Bad Request", 408: "Request Timeout", 413: "Content Too Large", 431: "Request Header Fields Too Large",
    429: "Too Many Requests", 502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout",
}


@dataclass(frozen=True)
class TapSettings:
    upstream: str  # base URL of the engine, e.g. http://127.0.0.1:8000
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    inject_usage: bool = True
    connect_timeout_s: float = 10.0
    # A client connection with no request in flight is closed after this long without a byte
    # from it (nginx: keepalive_timeout 75s), so idle or stalled clients cannot pile up.
    client_idle_timeout_s: float = 75.0
    upstream_ca: str = ""  # PEM file of CAs to trust for an https:// upstream ("" = the system's)
    # Deadlines towards the engine (exporter.tap.deadlines); None = derived from the SLO files.
    first_token_timeout_s: float | None = None
    stall_timeout_s: float | None = None
    response_timeout_s: float | None = None
    # x-slo-class / x-slo-ttft-ms / x-slo-tpot-ms change what a request is held to, so any client
    # could make its own requests good; honoured only when the operator says clients are trusted.
    trust_slo_headers: bool = False
    # Abuse limits: what one client controls is bounded, so no client can starve the others.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S
    max_buffered_body_bytes: int = DEFAULT_MAX_BUFFERED_BODY_BYTES


@dataclass(frozen=True)
class RequestRecord:
    """One timed request as the tap saw it; given to the optional observer (tests, debugging)."""

    request_id: str  # the client's x-request-id header, "" when absent
    path: str
    model: str
    slo_class: str
    streamed: bool
    usage_injected: bool
    outcome: str
    status: int
    timings: Timings
    good: bool
    objective: Objective
    arrival: float  # the tap's clock (time.perf_counter) when the request arrived


Observer = Callable[[RequestRecord], None]


@dataclass
class _Plan:
    """What the tap decided about one timed request before forwarding it."""

    model: str
    streamed: bool
    inject_usage: bool
    body: bytes | bytearray
    objective: Objective
    max_tokens: int | None = None  # per choice, from the request
    choices: int = 1  # the request's `n`


def _outcome_for_status(status: int) -> str:
    if status >= 500 or status == 429:  # 429: the engine is out of capacity, which an SLO must see
        return C.OUTCOME_UPSTREAM_ERROR
    if status >= 400:
        return C.OUTCOME_CLIENT_ERROR
    return C.OUTCOME_OK


def _with_include_usage(body: bytes | bytearray, f: RequestFields) -> bytes:
    """The request body asking for usage. When `stream_options` is absent the key is spliced in
    after the opening brace, leaving every other byte as the client wrote it (one copy of the
    body: the tail is joined from a view). Otherwise the body is parsed again and rewritten with
    `include_usage` merged into the client's options (rare: a client setting stream options
    without asking for usage)."""
    if f.empty:
        return b'{"stream_options":{"include_usage":true}}'
    if not f.has_stream_options:
        brace = body.index(b"{")
        return b"".join((body[: brace + 1], b'"stream_options":{"include_usage":true},', memoryview(body)[brace + 1 :]))
    doc = json.loads(body)
    opts = doc["stream_options"]
    doc["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def _simple_response(status: int, text: str, close: bool, retry_after: int | None = None) -> bytes:
    body = text.encode()
    extra = (b"Connection: close\r\n" if close else b"") + (
        b"Retry-After: %d\r\n" % retry_after if retry_after is not None else b""
    )
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n%s\r\n"
        % (status, _REASONS.get(status, "Error").encode(), len(body), extra)
    ) + body


def _text(value: bytes | None) -> str:
    return "" if value is None else value.decode("latin-1")


class TapProxy:
    """What every connection shares: settings, SLO classes, metrics, the upstream pool."""

    def __init__(
        self,
        settings: TapSettings,
        slo: SloConfig,
        metrics: TapMetrics | None = None,
        observer: Observer | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.settings = settings
        self.slo = slo
        self.metrics = metrics
        self.observer = observer
        self.clock = clock
        # KV admission (exporter.tap.admission), when --admission is on: asked once per new timed request.
        self.admission: Admission | None = None
        self.pool = UpstreamPool(settings.upstream, settings.connect_timeout_s, settings.upstream_ca)
        self.deadlines: Deadlines = derive_deadlines(
            slo, settings.first_token_timeout_s, settings.stall_timeout_s, settings.response_timeout_s
        )
        self.connections: set[ClientConnection] = set()
        self.accepting = True
        self.buffered_body_bytes = 0  # request bodies held now, on every connection together
        self._ticker: asyncio.TimerHandle | None = None
        shortest = min(self.deadlines.first_token_s, self.deadlines.stall_s, settings.head_timeout_s)
        self.tick_s = min(0.5, max(0.01, shortest / 5))  # how often deadlines are checked

    # -- deadlines -------------------------------------------------------------------------
    def start(self) -> None:
        """Start checking deadlines (call on the running loop; TapServer does)."""
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().call_later(self.tick_s, self._tick)

    def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    def _tick(self) -> None:
        now = self.clock()
        for conn in list(self.connections):
            conn.check_deadlines(now)
        self._ticker = asyncio.get_running_loop().call_later(self.tick_s, self._tick)

    def refused(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.refused(reason)

    def release_body(self, n: int) -> None:
        self.buffered_body_bytes -= n

    def protocol(self) -> ClientConnection:
        return ClientConnection(self)

    # -- shutdown --------------------------------------------------------------------------
    def busy(self) -> int:
        return sum(1 for c in self.connections if c.exchange is not None)

    def close_idle(self) -> int:
        """Close client connections that sent nothing for client_idle_timeout_s while no request of
        theirs was in flight; returns how many. Run periodically (TapServer does)."""
        cutoff = self.clock() - self.settings.client_idle_timeout_s
        idle = [c for c in self.connections if c.exchange is None and c.last_activity < cutoff]
        for conn in idle:
            conn.close()
        return len(idle)

    async def drain(self, timeout_s: float) -> None:
        """Stop taking requests, let in-flight ones finish (up to timeout_s), then close everything."""
        self.accepting = False
        for conn in list(self.connections):
            if conn.exchange is None:
                conn.close()
        deadline = time.monotonic() + timeout_s
        while self.busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.exchange is not None:
                conn.exchange.cut()  # the user got a truncated answer: the tap's failure, not the client's
            conn.abort()
        self.pool.close()
        self.stop()
        await asyncio.sleep(0)  # let connection_lost callbacks run

    # -- planning and accounting -----------------------------------------------------------
    def plan(self, head: RequestHead, body: bytes | bytearray) -> _Plan:
        headers: dict[str, str] = {}
        if self.settings.trust_slo_headers:
            headers = {
                k.lower().decode("latin-1"): v.decode("latin-1") for k, v in head.fields if k[:6].lower() == b"x-slo-"
            }
        f = read_fields(body)
        if not f.is_object:
            return _Plan("", False, False, body, self.slo.resolve(headers, ""))
        inject = f.stream and self.settings.inject_usage and not f.include_usage
        if inject:
            body = _with_include_usage(body, f)
        return _Plan(f.model, f.stream, inject, body, self.slo.resolve(headers, f.model), f.max_tokens, f.choices)

    def account(
        self, head: RequestHead, plan: _Plan, timing: RequestTiming, outcome: str, status: int, streamed: bool,
        body_bytes: int = 0,
    ) -> None:
        obj = plan.objective
        model = self.metrics.model_label(plan.model) if self.metrics is not None else plan.model
        n = timing.usage_tokens
        if n is not None and not plausible_usage(n, plan.max_tokens, plan.choices, body_bytes):
            timing.usage_tokens = None  # n_out falls back to the output events counted
            log.debug("event=tap_usage_rejected completion_tokens=%d max_tokens=%s body_bytes=%d", n,
                        plan.max_tokens, body_bytes)
            if self.metrics is not None:
                self.metrics.usage_rejected(model, obj.slo_class)
        t = timing.result(streamed=streamed)
        good = outcome == C.OUTCOME_OK and within_objectives(t, obj.ttft, obj.tpot, streamed=streamed)
        if self.metrics is not None:
            self.metrics.record(model, obj.slo_class, outcome, t, good)
        if self.observer is not None:
            record = RequestRecord(
                _text(head.get(b"x-request-id")), _text(head.path), model, obj.slo_class, streamed,
                plan.inject_usage, outcome, status, t, good, obj, timing.arrival,
            )
            try:
                self.observer(record)
            except Exception:  # an observer's bug must not break the relay
                log.exception("event=tap_observer_failed")

    def upstream_head(
        self, head: RequestHead, body_length: int, has_body: bool, timed: bool, connection: set[bytes],
        upgrade: bytes | None = None,
    ) -> bytes:
        """The request head as sent upstream: the client's fields minus connection-specific ones
        (those `connection`, the client's Connection options, names too; but an upgrade, e.g. to
        WebSocket, is asked for again: the tap relays it as a tunnel). The body follows it as it is."""
        drop = _DROP_REQUEST | connection
        if timed:
            drop = drop | {b"accept-encoding"}
        pool = self.pool
        lines = [b"%s %s%s HTTP/1.1\r\nHost: %s\r\n" % (head.method, pool.path_prefix, http1.origin_form(head.target),
                                                          pool.host_field)]
        lines.extend(k + b": " + v + b"\r\n" for k, v in head.fields if k.lower() not in drop)
        if timed:
            lines.append(b"Accept-Encoding: identity\r\n")  # the tap must read the stream it times
        if has_body:
            lines.append(b"Content-Length: %d\r\n" % body_length)
        if upgrade is not None:
            lines.append(b"Connection: upgrade\r\nUpgrade: %s\r\n" % upgrade)
        lines.append(b"\r\n")
        return b"".join(lines)


# Client connection states.
_HEAD, _BODY, _BUSY, _DRAIN, _TUNNEL = range(5)


class ClientConnection(asyncio.Protocol):
    """One client's connection: reads requests one at a time and runs an Exchange for each."""

    def __init__(self, proxy: TapProxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None
        self.state = _HEAD
        self.buf = b""
        self.arrival = 0.0
        self.head: RequestHead | None = None
        self.body_left = 0  # with a Content-Length body: bytes still to read
        self.body = bytearray()
        self.body_size = 0
        self.reserved = 0  # bytes of proxy.buffered_body_bytes this connection's body holds
        self.decoder: http1.ChunkedDecoder | None = None  # with a chunked body
        self.exchange: Exchange | None = None
        self.last_activity = proxy.clock()
        # When the head of the request being received had to start arriving (None: idle between requests).
        self.head_started: float | None = self.last_activity
        self._advancing = False
        self._reading_paused = False
        self._slice_pending = False  # a chunked body is being decoded a slice per turn of the loop
        self.writing_paused = False  # the client's socket buffer is full
        self._linger: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        proxy = self.proxy
        if len(proxy.connections) >= proxy.settings.max_connections:
            proxy.refused(C.REFUSED_CONNECTION_LIMIT)
            self.refuse(503, f"the tap is at its limit of {proxy.settings.max_connections} client connections; "
                        "retry shortly\n", retry_after=1)
            return
        proxy.connections.add(self)

    def data_received(self, data: bytes) -> None:
        state = self.state
        if state == _TUNNEL:
            if self.exchange is not None:
                self.exchange.to_upstream(data)
            return
        if state == _DRAIN:
            return
        now = self.last_activity = self.proxy.clock()
        if state != _BODY and not self.buf:
            self.arrival = now  # the first bytes of a request (pipelined ones may come while busy)
            if self.head_started is None and state == _HEAD:
                self.head_started = now
        self.buf = self.buf + data if self.buf else data
        if state == _BUSY:
            # Pipelined bytes wait for the current response; a flood of them stops reading.
            if len(self.buf) > http1.MAX_HEAD_BYTES and not self._reading_paused and self.transport is not None:
                self._reading_paused = True
                self.transport.pause_reading()
            return
        self._advance()

    def eof_received(self) -> bool:
        return False  # a client that stops sending mid-exchange has gone: close, and cancel upstream

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy.connections.discard(self)
        self._release_body()
        if self._linger is not None:
            self._linger.cancel()
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.client_lost()

    def pause_writing(self) -> None:
        self.writing_paused = True
        if self.exchange is not None:
            self.exchange.pause_upstream()

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.exchange is not None:
            self.exchange.resume_upstream()

    def check_deadlines(self, now: float) -> None:
        """Called every tick: the head deadline here, the upstream deadlines in the exchange."""
        if self.exchange is not None:
            self.exchange.check_deadline(now)
        elif self.state == _HEAD and self.head_started is not None:
            if now - self.head_started > self.proxy.settings.head_timeout_s:
                self.proxy.refused(C.REFUSED_HEAD_TIMEOUT)
                self.refuse(408, f"the request head did not arrive within {self.proxy.settings.head_timeout_s:g} s\n")

    # -- requests --------------------------------------------------------------------------
    def _advance(self) -> None:
        """Parse as far as the buffered bytes allow; start the exchange for a complete request."""
        if self._advancing:
            return
        self._advancing = True
        try:
            while self.state in (_HEAD, _BODY) and self.buf and not self._slice_pending:
                if self.state == _HEAD and not self._read_head():
                    return
                if self.state == _BODY and not self._read_body():
                    return
        except BadMessage as e:
            self.proxy.refused(C.REFUSED_MALFORMED)
            self.refuse(400, f"malformed request: {e}\n")
        finally:
            self._advancing = False

    def _read_head(self) -> bool:
        end = self.buf.find(http1.HEAD_END)
        if end > http1.MAX_HEAD_BYTES or (end < 0 and len(self.buf) > http1.MAX_HEAD_BYTES):
            self.proxy.refused(C.REFUSED_HEAD_TOO_LARGE)
            self.refuse(431, f"request head larger than {http1.MAX_HEAD_BYTES} bytes\n")
            return False
        if end < 0:
            return False
        head = http1.parse_request_head(self.buf[:end])
        self.buf = self.buf[end + 4 :]
        length = http1.request_body_length(head)
        if length is not None and length > self.proxy.settings.max_body_bytes:
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
        self.state = _BODY
        if length == 0:
            self._start()
        return True

    def _reserve(self, n: int) -> bool:
        """Count n more body bytes against the tap-wide cap; refuse the request (503) when over it."""
        proxy = self.proxy
        if proxy.buffered_body_bytes + n > proxy.settings.max_buffered_body_bytes:
            proxy.refused(C.REFUSED_BODY_MEMORY)
            self.refuse(503, "the tap holds too many request bodies right now; retry shortly\n", retry_after=1)
            return False
        proxy.buffered_body_bytes += n
        self.reserved += n
        return True

    def _release_body(self) -> None:
        if self.reserved:
            self.proxy.release_body(self.reserved)
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
                if self.body_size + len(payload) > self.proxy.settings.max_body_bytes:
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
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()
        asyncio.get_running_loop().call_later(spent, self._next_slice)

    def _next_slice(self) -> None:
        self._slice_pending = False
        if self.state != _BODY:
            return
        self._advance()
        transport = self.transport
        if not self._slice_pending and self.state == _BODY and self._reading_paused and transport is not None:
            self._reading_paused = False
            if not transport.is_closing():
                transport.resume_reading()

    def _start(self) -> None:
        head = self.head
        assert head is not None
        body = self.body if self.body_size == len(self.body) else self.body[: self.body_size]
        has_body = self.decoder is not None or head.get(b"content-length") is not None
        self.head, self.body = None, bytearray()
        reserved, self.reserved = self.reserved, 0  # the exchange holds the body now
        self.state = _BUSY
        arrival = self.arrival
        if self.buf:
            self.arrival = self.proxy.clock()  # a pipelined request that is already here
        self.exchange = Exchange(self.proxy, self, head, body, has_body, arrival, reserved)
        self.exchange.start()

    def start_tunnel(self) -> None:
        """The upstream switched protocols: from now on bytes pass both ways unparsed."""
        self.state = _TUNNEL
        buf, self.buf = self.buf, b""
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        if buf and self.exchange is not None:
            self.exchange.to_upstream(buf)

    def exchange_done(self, close: bool) -> None:
        """Called by the exchange once its response is complete (or could not be given)."""
        self.exchange = None
        self.last_activity = self.proxy.clock()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if close or not self.proxy.accepting:
            transport.close()
            return
        self.state = _HEAD
        self.head_started = self.last_activity if self.buf else None  # a pipelined head is already arriving
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        if self.buf:
            self._advance()

    def _refuse_body(self) -> None:
        self.proxy.refused(C.REFUSED_BODY_TOO_LARGE)
        self.refuse(413, f"request body larger than the tap's limit of {self.proxy.settings.max_body_bytes} bytes\n")

    def refuse(self, status: int, text: str, retry_after: int | None = None) -> None:
        """Answer with the tap's own error and close, draining what the client is still uploading.

        Closing a socket with unread bytes makes the kernel send a reset, which can destroy the
        answer before the client reads it; so the tap half-closes and discards input for a while.
        """
        transport = self.transport
        self.state, self.buf = _DRAIN, b""
        self._release_body()
        if self._reading_paused and transport is not None and not transport.is_closing():
            self._reading_paused = False
            transport.resume_reading()  # discard what the client still sends, rather than leave it unread
        if transport is None or transport.is_closing():
            return
        transport.write(_simple_response(status, text, close=True, retry_after=retry_after))
        if transport.can_write_eof():
            transport.write_eof()
            self._linger = asyncio.get_running_loop().call_later(LINGER_S, transport.close)
        else:
            transport.close()

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


# How the client gets the response body.
_RAW = 0  # the upstream's body bytes exactly as they arrived (its framing included)
_CHUNKS = 1  # re-framed in chunks of our own (the body changed, or the upstream delimits it by closing)
_PLAIN = 2  # decoded bytes, the end marked by closing (an HTTP/1.0 client)


class Exchange:
    """One request forwarded upstream and its response relayed back, with its timing."""

    def __init__(
        self, proxy: TapProxy, client: ClientConnection, head: RequestHead, body: bytes | bytearray, has_body: bool,
        arrival: float, reserved: int = 0,
    ) -> None:
        self.proxy = proxy
        self.client = client
        self.head = head
        self.timing = RequestTiming(arrival)
        self.reserved = reserved  # body bytes counted against the tap-wide cap until the engine has them
        connection = http1.connection_tokens(head.fields)
        self.upgrade = head.get(b"upgrade") if b"upgrade" in connection else None
        timed = head.method == b"POST" and head.path in TIMED_PATHS and self.upgrade is None
        self.plan = proxy.plan(head, body) if timed else None
        if self.plan is not None:
            body, self.plan.body = self.plan.body, b""  # one reference to the body: it is freed once sent
        self.request_head = proxy.upstream_head(head, len(body), has_body, timed, connection, self.upgrade)
        self.request_body = body
        self.client_close = head.version == b"1.0" or b"close" in connection
        self.last_read = arrival  # when the upstream last sent bytes (or the client last made room for them)
        self.body_bytes = 0  # decoded response body bytes
        self.conn: UpstreamConnection | None = None
        self.task: asyncio.Task[None] | None = None
        self.done = False
        # Response state, set once its head arrives.
        self.rbuf = b""
        self.response: ResponseHead | None = None
        self.status = 0
        self.outcome = C.OUTCOME_OK
        self.streamed = False  # a timed SSE stream
        self.relay: Relay | None = None
        self.framing = 0  # body length, CHUNKED or UNTIL_CLOSE
        self.left = 0
        self.decoder: http1.ChunkedDecoder | None = None
        self.mode = _RAW
        self.prefix = b""  # the response head, written with the first body bytes
        self.terminated = False  # the client already got the last-chunk marker
        self.reusable = self.upgrade is None
        self.tunnel = False  # switched protocols (101): bytes pass both ways unparsed

    # -- forwarding ------------------------------------------------------------------------
    def start(self) -> None:
        admission = self.proxy.admission
        if self.plan is not None and admission is not None and not admission.admit():
            # Refused before anything reached the engine; requests already admitted are never touched.
            self._fail("the engine is full (KV admission); retry later\n", 429, C.OUTCOME_REFUSED,
                       retry_after=admission.retry_after_s)
            return
        conn = self.proxy.pool.take_idle()
        if conn is not None:
            self._send(conn)
        else:
            self.task = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        try:
            conn = await self.proxy.pool.connect()
        except _UPSTREAM_FAILURES as e:
            self.task = None
            if not self.done:
                self._fail(f"upstream unreachable: {type(e).__name__}\n")
            return
        self.task = None
        if self.done:  # the client left while the tap was connecting: keep the fresh connection
            self.proxy.pool.release(conn, reusable=True)
            return
        self._send(conn)

    def _send(self, conn: UpstreamConnection) -> None:
        self.conn = conn
        conn.user = self
        assert conn.transport is not None
        conn.transport.write(self.request_head)
        if self.request_body:
            conn.transport.write(self.request_body)
        self.request_head, self.request_body = b"", b""
        if self.client.writing_paused:  # the previous response has not drained yet
            self.pause_upstream()

    def _release_body(self) -> None:
        if self.reserved:
            self.proxy.release_body(self.reserved)
            self.reserved = 0

    def _fail(
        self, text: str, status: int = 502, outcome: str = C.OUTCOME_UPSTREAM_ERROR, retry_after: int | None = None,
    ) -> None:
        """No response from the upstream: answer with the tap's own error (502, 504 for a deadline, 429
        for an admission refusal)."""
        self.timing.on_end(self.proxy.clock())
        self.status = status
        self.client.write(_simple_response(status, text, close=self.client_close, retry_after=retry_after))
        self._finish(outcome, close=self.client_close)

    def check_deadline(self, now: float) -> None:
        """End the request as `upstream_timeout` once the engine kept it waiting past a deadline."""
        if self.done or self.tunnel:
            return
        if self.client.writing_paused:
            self.last_read = now  # the client is not reading: the engine is not the one stalling
            return
        d = self.proxy.deadlines
        plan = self.plan
        if plan is not None and plan.streamed and self.timing.first_token_at is None:
            limit, since, what = max(d.first_token_s, plan.objective.ttft or 0.0), self.timing.arrival, "first token"
        elif self.response is None:
            limit, since, what = d.response_s, self.timing.arrival, "response"
        elif plan is not None:
            limit, since, what = d.stall_s, self.last_read, "next bytes of the response"
        else:
            return  # an untimed body (e.g. a long poll) once it has started: the client decides
        if now - since > limit:
            self._timeout(what, limit)

    def _timeout(self, what: str, limit: float) -> None:
        self.reusable = False  # closing the upstream connection is how the engine learns of the abandon
        log.debug("event=tap_upstream_timeout waited_for=%s limit_s=%g path=%s", what.replace(" ", "_"), limit,
                    _text(self.head.path))
        if self.response is None or self.prefix:  # the client has had nothing: answer 504
            self._fail(f"the engine sent no {what} within {limit:g} s\n", 504, C.OUTCOME_UPSTREAM_TIMEOUT)
        else:  # the response has started: break it off, as for an upstream break
            self.timing.on_end(self.proxy.clock())
            self._finish(C.OUTCOME_UPSTREAM_TIMEOUT, close=True, abort=True)

    # -- upstream callbacks ----------------------------------------------------------------
    def upstream_data(self, data: bytes) -> None:
        if self.tunnel:
            self.client.write(data)
            return
        t = self.last_read = self.proxy.clock()
        if self.reserved:
            self._release_body()  # the engine answers: it has read the request
        if self.response is None:
            data = self._head(data, t)
            if not data or self.done:
                return
        self._body(data, t)

    def _head(self, data: bytes, t: float) -> bytes:
        """Buffer the response head; once it is complete, prepare the client's and return the body bytes after it."""
        rbuf = self.rbuf + data if self.rbuf else data
        while True:
            end = rbuf.find(http1.HEAD_END)
            if end > http1.MAX_HEAD_BYTES or (end < 0 and len(rbuf) > http1.MAX_HEAD_BYTES):
                self.reusable = False
                self._fail("upstream response head too large\n")
                return b""
            if end < 0:
                self.rbuf = rbuf
                return b""
            try:
                head = http1.parse_response_head(rbuf[:end])
                framing = http1.response_body_length(head, self.head.method)
            except BadMessage as e:
                self.reusable = False
                self._fail(f"upstream sent a malformed response: {e}\n")
                return b""
            if head.status == 101 and self.upgrade is not None:
                self._open_tunnel(rbuf[: end + 4], rbuf[end + 4 :])
                return b""
            rbuf = rbuf[end + 4 :]
            if head.status >= 200:
                break  # 1xx interim responses are not relayed
        self.rbuf = b""
        self._respond(head, framing, t)
        if framing == 0:
            self._end(t)
            return b""
        return rbuf

    def _open_tunnel(self, head: bytes, rest: bytes) -> None:
        """Relay the upstream's 101 as it came and join the two connections (e.g. a WebSocket)."""
        self.tunnel, self.status, self.rbuf = True, 101, b""
        self.client.write(head + rest)
        self.client.start_tunnel()

    def to_upstream(self, data: bytes) -> None:
        conn = self.conn
        if conn is not None and conn.transport is not None and not conn.transport.is_closing():
            conn.transport.write(data)

    def upstream_full(self, full: bool) -> None:
        """Tunnel backpressure the other way: a full upstream socket stops reading from the client."""
        transport = self.client.transport
        if self.tunnel and transport is not None and not transport.is_closing():
            transport.pause_reading() if full else transport.resume_reading()

    def _respond(self, head: ResponseHead, framing: int, t: float) -> None:
        self.response, self.status, self.framing = head, head.status, framing
        self.timing.on_headers(t)
        self.outcome = _outcome_for_status(head.status)
        if b"close" in http1.connection_tokens(head.fields) or head.version == b"1.0":
            self.reusable = False
        plan = self.plan
        content_type = head.get(b"content-type") or b""
        self.streamed = plan is not None and plan.streamed and content_type.startswith(b"text/event-stream")
        strip = self.streamed and plan is not None and plan.inject_usage
        if self.streamed:
            self.relay = SseRelay(self.timing, strip)
        elif plan is not None:
            self.relay = BodyRelay(self.timing)
        if framing == CHUNKED:
            self.decoder = http1.ChunkedDecoder()
        elif framing > 0:
            self.left = framing
        # The client's framing.
        if framing == 0:
            self.mode, framing_field, keep_length = _RAW, b"", True
        elif self.client_close and (framing < 0 or strip):
            self.mode, framing_field, keep_length = _PLAIN, b"", False
        elif strip or framing == UNTIL_CLOSE:
            self.mode, framing_field, keep_length = _CHUNKS, b"Transfer-Encoding: chunked\r\n", False
        else:
            # A Content-Length next to Transfer-Encoding is dropped (RFC 9112 6.3): the chunks decide.
            chunked = framing == CHUNKED
            self.mode, framing_field, keep_length = _RAW, b"Transfer-Encoding: chunked\r\n" if chunked else b"", not chunked
        drop = http1.HOP_BY_HOP | http1.connection_tokens(head.fields)
        if not keep_length:
            drop = drop | {b"content-length"}
        lines = [b"HTTP/1.1 %d %s\r\n" % (head.status, head.reason)]
        lines.extend(k + b": " + v + b"\r\n" for k, v in head.fields if k.lower() not in drop)
        lines.append(framing_field)
        if self.client_close or self.mode == _PLAIN:
            lines.append(b"Connection: close\r\n")
        lines.append(b"\r\n")
        self.prefix = b"".join(lines)

    def _body(self, data: bytes, t: float) -> None:
        framing = self.framing
        decoder = self.decoder
        if decoder is not None:
            boundary_before = decoder.at_boundary
            try:
                payload, used = decoder.feed(data)
            except BadMessage:
                self._broken()
                return
            raw = data if used == len(data) else data[:used]
            finished = decoder.done
        elif framing > 0:
            boundary_before = True
            used = min(self.left, len(data))
            raw = payload = data if used == len(data) else data[:used]
            self.left -= used
            finished = not self.left
        else:  # until the upstream closes
            boundary_before, used, raw, payload, finished = True, len(data), data, data, False
        if used < len(data):
            self.reusable = False  # bytes past the end of the response: the connection is out of step
        self.body_bytes += len(payload)
        relay = self.relay
        out = relay.feed(payload, t) if relay is not None and payload else None
        mode = self.mode
        if mode == _RAW:
            send = raw
        elif mode == _CHUNKS:
            if out is None and decoder is not None and boundary_before and decoder.at_boundary:
                send = raw  # whole chunks, unchanged: as they came
                self.terminated = finished
            else:
                body = payload if out is None else out
                send = http1.chunk(body) if body else b""
        else:
            send = payload if out is None else out
        if self.prefix:
            send, self.prefix = self.prefix + send, b""
        if send:
            self.client.write(send)
        if finished:
            self._end(t)

    def _end(self, t: float) -> None:
        """The response body ended normally."""
        relay = self.relay
        tail = relay.finish(t) if relay is not None else b""
        if self.mode == _CHUNKS:
            tail = (http1.chunk(tail) if tail else b"") + (b"" if self.terminated else http1.LAST_CHUNK)
        send = self.prefix + tail
        if send:
            self.client.write(send)
        self.prefix = b""
        self._finish(self._ended_outcome(relay), close=self.client_close or self.mode == _PLAIN)

    def _ended_outcome(self, relay: Relay | None) -> str:
        """The outcome of a body that ended by its framing (or by a close, for a close-delimited one)."""
        if relay is not None and relay.error_event:
            return C.OUTCOME_ABORTED
        if self.outcome != C.OUTCOME_OK:
            return self.outcome
        if isinstance(relay, SseRelay) and not self.timing.complete:
            return C.OUTCOME_TRUNCATED  # no [DONE] nor finish_reason: the client did not get the whole answer
        if isinstance(relay, BodyRelay) and self.framing == UNTIL_CLOSE and not relay.parsed:
            return C.OUTCOME_TRUNCATED  # cut by a close: only a complete JSON body tells it ended
        return C.OUTCOME_OK

    def upstream_lost(self) -> None:
        """The upstream connection closed (or was reset)."""
        self.conn = None
        if self.done:
            return
        if self.tunnel:
            self._finish(C.OUTCOME_OK, close=True)
        elif self.response is None:
            self.reusable = False
            self._fail("upstream closed the connection before responding\n")
        elif self.framing == UNTIL_CLOSE:
            self.reusable = False
            self._end(self.proxy.clock())
        else:
            self._broken()

    def _broken(self) -> None:
        """The upstream broke off mid-body. Pass the break on: close the client's connection
        without the end of the body, as nginx does, so the client cannot mistake a truncated
        response for a complete one."""
        self.reusable = False
        self._finish(C.OUTCOME_ABORTED, close=True, abort=True)

    def cut(self) -> None:
        """The tap is shutting down with this response unfinished: count it as aborted."""
        if not self.done:
            self.reusable = False
            self._finish(C.OUTCOME_ABORTED, close=True, abort=True)

    # -- client callbacks ------------------------------------------------------------------
    def client_lost(self) -> None:
        if self.done:
            return
        self.reusable = False  # closing the upstream connection is how the engine learns of the abort
        self._finish(self._left_outcome(self.proxy.clock()), close=True)

    def _left_outcome(self, now: float) -> str:
        """The outcome of a request whose client went away before its response ended."""
        if self.timing.complete or (self.response is not None and self.outcome != C.OUTCOME_OK):
            return self.outcome  # it got the whole answer (real clients close after [DONE]), or an error
        plan = self.plan
        if plan is not None:
            obj = plan.objective
            limit = None if plan.max_tokens is None else plan.max_tokens * plan.choices
            if gave_up(self.timing, now, obj.ttft, obj.tpot, plan.streamed, limit):
                return C.OUTCOME_CLIENT_GAVE_UP  # it stopped waiting only once the objective was lost
        return C.OUTCOME_CLIENT_DISCONNECTED

    def pause_upstream(self) -> None:
        conn = self.conn
        if conn is not None and conn.transport is not None and not conn.transport.is_closing():
            conn.transport.pause_reading()

    def resume_upstream(self) -> None:
        self.last_read = self.proxy.clock()
        conn = self.conn
        if conn is not None and conn.transport is not None and not conn.transport.is_closing():
            conn.transport.resume_reading()

    # -- the end ---------------------------------------------------------------------------
    def _finish(self, outcome: str, close: bool, abort: bool = False) -> None:
        if self.done:
            return
        self.done = True
        self._release_body()
        self.request_head, self.request_body = b"", b""
        conn, self.conn = self.conn, None
        if conn is not None:
            complete = self.response is not None and self.rbuf == b"" and self.framing != UNTIL_CLOSE
            self.proxy.pool.release(conn, reusable=self.reusable and complete)
        if self.plan is not None:
            self.proxy.account(self.head, self.plan, self.timing, outcome, self.status, self.streamed, self.body_bytes)
        if abort:
            self.client.abort()
        self.client.exchange_done(close=close)
