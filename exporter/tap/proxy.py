"""The goodput tap: an HTTP/1.1 reverse proxy that relays bytes unchanged and times completions.

Built on bare asyncio protocols rather than a web framework: the tap sits in the path of
every token, and a framework's per-request objects and per-write coroutines were most of the
latency it added. This module holds what every connection shares (`TapProxy`: settings, SLO
classes, metrics, the upstream pool, deadlines, shutdown) and the per-request decisions made
before forwarding (the plan, the upstream head) and after (accounting). Each client connection
(exporter.tap.connection) reads requests; each request becomes an Exchange
(exporter.tap.exchange) that forwards it on a pooled upstream connection and relays the
response as its bytes arrive, from the upstream's `data_received` straight to the client's
transport; outcomes are exporter.tap.outcomes', framing exporter.tap.http1's. A body the tap does not change goes out as the very bytes that came in, chunked
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
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.logs import TAP_LOGGER, event, format_event
from exporter.tap import http1
from exporter.tap.classes import Objective, SloConfig
from exporter.tap.connection import ClientConnection
from exporter.tap.deadlines import Deadlines, derive_deadlines
from exporter.tap.http1 import RequestHead, field_text
from exporter.tap.metrics import TapMetrics
from exporter.tap.request_fields import RequestFields, read_fields
from exporter.tap.seats import InFlight
from exporter.tap.timing import RequestTiming, Timings, plausible_usage, within_objectives
from exporter.tap.upstream import UpstreamPool
from llmslo import conventions as C

if TYPE_CHECKING:
    from exporter.tap.admission import Admission

log = logging.getLogger(TAP_LOGGER)

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
# Every request body being received or handed to the engine, together: 16 concurrent uploads of
# 31 MB would otherwise hold half a gigabyte. Four such bodies fit at once; more wait for a 503.
DEFAULT_MAX_BUFFERED_BODY_BYTES = 128 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS = 4096  # the CLI derives its default from the file-descriptor limit instead
# A request head must arrive whole within this long (from the connection's accept, or from its first
# byte on a kept-alive connection): trickling bytes do not extend it (slowloris). nginx: 60 s per read.
DEFAULT_HEAD_TIMEOUT_S = 10.0
_DROP_REQUEST = http1.HOP_BY_HOP | {b"host", b"content-length", b"expect"}


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


# A prompt's tokens beyond its request's bytes (a chat template, an image's tokens from a short URL) that a
# usage.prompt_tokens may still claim; a larger count is not believed for the seat estimate (a lying engine
# could otherwise inflate the footprint and close the gate).
PROMPT_TOKENS_OVER_BYTES = 65_536


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
    request_bytes: int = 0  # the body's length (the body itself is freed once sent)


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
        if metrics is not None:
            metrics.late_source = self.in_flight_late
        self.tick_s = self._tick_for(self.deadlines)  # how often deadlines are checked

    def _tick_for(self, deadlines: Deadlines) -> float:
        shortest = min(deadlines.first_token_s, deadlines.stall_s, self.settings.head_timeout_s)
        return min(0.5, max(0.01, shortest / 5))

    def _deadlines_for(self, slo: SloConfig) -> Deadlines:
        s = self.settings
        return derive_deadlines(slo, s.first_token_timeout_s, s.stall_timeout_s, s.response_timeout_s)

    def check_deadlines_fit(self, slo: SloConfig) -> None:
        """DeadlineError if the deadline flags would cut requests still on time under `slo` (a reload's check)."""
        self._deadlines_for(slo)

    def set_slo(self, slo: SloConfig) -> None:
        """Resolve requests that arrive from now on with `slo`. A request in flight keeps the Objective it
        was given (its _Plan holds it); the deadlines follow the new objectives (each request's own TTFT
        objective still bounds its first-token deadline, exporter.tap.exchange)."""
        deadlines = self._deadlines_for(slo)
        self.slo, self.deadlines, self.tick_s = slo, deadlines, self._tick_for(deadlines)

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

    def in_flight(self) -> list[InFlight]:
        """The timed requests in flight now, with their output so far and their cap (the seat estimate's,
        exporter.tap.seats): one pass over the connections, at most max_connections."""
        out = []
        for conn in self.connections:
            ex = conn.exchange
            if ex is not None and not ex.done and ex.plan is not None:
                cap = None if ex.plan.max_tokens is None else ex.plan.max_tokens * ex.plan.choices
                out.append(InFlight(ex.timing.output_events, cap))
        return out

    def in_flight_late(self) -> dict[tuple[str, str], int]:
        """Timed requests in flight now whose objective is already lost, by (model label, slo_class).

        Read at scrape time: one pass over the connections (at most max_connections), a few
        comparisons each, so a hang shows on the page while it lasts, not only once it ends."""
        now = self.clock()
        label = self.metrics.model_label if self.metrics is not None else str
        late: dict[tuple[str, str], int] = {}
        for conn in self.connections:
            ex = conn.exchange
            if ex is not None and not ex.done and ex.plan is not None and ex.late(now):
                key = (label(ex.plan.model), ex.plan.objective.slo_class)
                late[key] = late.get(key, 0) + 1
        return late

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
        return _Plan(f.model, f.stream, inject, body, self.slo.resolve(headers, f.model), f.max_tokens, f.choices,
                     len(body))

    def account(
        self, head: RequestHead, plan: _Plan, timing: RequestTiming, outcome: str, status: int, streamed: bool,
        body_bytes: int = 0,
    ) -> None:
        obj = plan.objective
        model = self.metrics.model_label(plan.model) if self.metrics is not None else plan.model
        n = timing.usage_tokens
        if n is not None and not plausible_usage(n, plan.max_tokens, plan.choices, body_bytes):
            timing.usage_tokens = None  # n_out falls back to the output events counted
            event("tap_usage_rejected", logging.DEBUG, logger=TAP_LOGGER, completion_tokens=n,
                  max_tokens=plan.max_tokens, body_bytes=body_bytes)
            if self.metrics is not None:
                self.metrics.usage_rejected(model, obj.slo_class)
        t = timing.result(streamed=streamed)
        prompt = timing.usage_prompt_tokens
        if self.admission is not None and outcome == C.OUTCOME_OK and timing.usage_tokens is not None \
                and prompt is not None and prompt <= plan.request_bytes + PROMPT_TOKENS_OVER_BYTES:
            self.admission.sizes.add(prompt, timing.usage_tokens)  # an exact size for the seat estimate
        good = outcome == C.OUTCOME_OK and within_objectives(t, obj.ttft, obj.tpot, streamed=streamed)
        if self.metrics is not None:
            self.metrics.record(model, obj.slo_class, outcome, t, good)
        if self.observer is not None:
            record = RequestRecord(
                field_text(head.get(b"x-request-id")), field_text(head.path), model, obj.slo_class, streamed,
                plan.inject_usage, outcome, status, t, good, obj, timing.arrival,
            )
            try:
                self.observer(record)
            except Exception:  # an observer's bug must not break the relay
                log.exception(format_event("tap_observer_failed", {}))

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
