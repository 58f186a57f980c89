"""The goodput tap: an HTTP/1.1 reverse proxy that relays bytes unchanged and times completions.

Built on bare asyncio protocols rather than a web framework: the tap sits in the path of
every token, and a framework's per-request objects and per-write coroutines were most of the
latency it added. This module holds what every connection shares (`TapProxy`: settings, SLO
classes, metrics, the upstream pool, deadlines, the connections, shutdown, the deadline tick) and
builds each request's collaborators. Each client connection (exporter.tap.connection) reads
requests; each request becomes an Exchange (exporter.tap.exchange), a cycle handed the request as
exporter.tap.policy decided to forward it and narrow collaborators, that forwards it on a pooled
upstream connection and relays the response as its bytes arrive, from the upstream's
`data_received` straight to the client's transport; the finished request comes back, judged by
exporter.tap.policy, to `TapProxy.record`. A body the tap does not change goes out as the very
bytes that came in, chunked framing included. Backpressure is the transports' own: a client whose
socket buffer fills pauses reading from the upstream, so the engine's send blocks instead of the
tap's memory growing.

Only POST /v1/chat/completions and /v1/completions are timed; everything else (/metrics,
/v1/models, /health, ...) passes through untouched. For a streamed completion whose client
did not ask for usage, the tap asks the upstream for it (`stream_options.include_usage`) so
n_out is the engine's token count, and takes the extra event out again before the client
sees it (exporter.tap.relay). Request and response contents are never logged or stored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from exporter.logs import TAP_LOGGER, event, format_event
from exporter.tap import policy
from exporter.tap.classes import SloConfig
from exporter.tap.connection import ClientConnection
from exporter.tap.deadlines import Deadlines, derive_deadlines
from exporter.tap.exchange import Client, Decision, Exchange, Gate, Services
from exporter.tap.http1 import RequestHead
from exporter.tap.metrics import TapMetrics
from exporter.tap.objectives import Objective
from exporter.tap.policy import Finished, Observer
from exporter.tap.seats import InFlight
from exporter.tap.settings import TapSettings
from exporter.tap.upstream import UpstreamPool

if TYPE_CHECKING:
    from exporter.tap.admission import Admission

log = logging.getLogger(TAP_LOGGER)
TICK_SLICE = 64  # client connections whose deadlines one callback checks


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
        label = metrics.model_label if metrics is not None else str
        self.services = Services(self.pool, clock, lambda: self.deadlines, self.record, self.release_body,
                                 self.refused, label)
        self._admission: Admission | None = None
        self.gate: Gate | None = None

    @property
    def admission(self) -> Admission | None:
        """The KV admission gate (exporter.tap.admission) when --admission is on: asked once per new timed request."""
        return self._admission

    @admission.setter
    def admission(self, admission: Admission | None) -> None:
        self._admission = admission
        self.gate = None if admission is None else Gate(self._decider(admission), admission.settle)

    def _decider(self, admission: Admission) -> Callable[[Objective, RequestHead, object], Decision]:
        """The gate's decision for one request, under the classes in force, for its client as the gate's turns
        count clients (exporter.tap.turns: the peer, or a trusted header's value)."""
        keys = admission.clients

        def decide(objective: Objective, head: RequestHead, peer: object) -> Decision:
            client = keys.key(peer, head.get(keys.header) if keys.header else None)
            return admission.decide_ticket(objective, self.slo, client)

        return decide

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
        was given (its policy.Plan holds it); the deadlines follow the new objectives (each request's own TTFT
        objective still bounds its first-token deadline, exporter.tap.exchange)."""
        deadlines = self._deadlines_for(slo)
        slo.derived = self.slo.derived  # header-derived classes stay bounded per process (exporter.tap.objectives)
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
        loop = asyncio.get_running_loop()
        self._check_slice(list(self.connections), 0, loop)
        self._ticker = loop.call_later(self.tick_s, self._tick)

    def _check_slice(self, conns: list[ClientConnection], start: int, loop: asyncio.AbstractEventLoop) -> None:
        """Check TICK_SLICE connections' deadlines, then let the loop relay before the next slice: a tick over
        every connection in one callback held the loop 0.74 ms at 256 streams, a delay every chunk due then had."""
        now = self.clock()
        live = self.connections
        end = start + TICK_SLICE
        for conn in conns[start:end]:
            if conn in live:  # not one that closed since the tick began
                conn.check_deadlines(now)
        if end < len(conns):
            loop.call_soon(self._check_slice, conns, end, loop)

    def in_flight(self) -> list[InFlight]:
        """The timed requests in flight now, with their output so far and their cap (the seat estimate's,
        exporter.tap.seats): one pass over the connections, at most max_connections."""
        out = []
        for conn in self.connections:
            ex = conn.exchange
            if ex is not None and not ex.done and ex.plan is not None:
                out.append(InFlight(ex.timing.output_events, ex.plan.cap))
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

    # -- the request's cycle ---------------------------------------------------------------
    def exchange(self, client: Client, head: RequestHead, body: bytes | bytearray, has_body: bool, arrival: float,
                 reserved: int) -> Exchange:
        """The cycle of one complete request, handed what it needs (exporter.tap.connection calls this)."""
        fwd = policy.forward(head, body, has_body, self.slo, self.settings, self.pool.path_prefix, self.pool.host_field)
        if fwd.plan is not None and fwd.plan.objective.ignored and self.metrics is not None:
            self.metrics.slo_headers_ignored(fwd.plan.objective.ignored)
        return Exchange(self.services, client, self.gate, head, fwd, arrival, reserved)

    def record(self, finished: Finished) -> None:
        """A timed request ended: count it, learn its size for the gate, tell the observer."""
        r = finished.record
        if finished.rejected_usage is not None:
            event("tap_usage_rejected", logging.DEBUG, logger=TAP_LOGGER, completion_tokens=finished.rejected_usage,
                  max_tokens=finished.plan.max_tokens, body_bytes=finished.body_bytes)
            if self.metrics is not None:
                self.metrics.usage_rejected(r.model, r.slo_class)
        if self._admission is not None and finished.size is not None:
            self._admission.sizes.add(*finished.size)  # an exact size for the seat estimate
        if self.metrics is not None:
            self.metrics.record(r.model, r.slo_class, r.outcome, r.timings, r.good, r.path)
        if self.observer is not None:
            try:
                self.observer(r)
            except Exception:  # an observer's bug must not break the relay
                log.exception(format_event("tap_observer_failed", {}))
