"""One request through the tap: forwarded upstream, its response relayed back as it arrives, timed.

An Exchange is one request's cycle, as uvicorn's RequestResponseCycle is: it is handed the request as the tap
forwards it (exporter.tap.policy.Forward) and narrow collaborators, never the server or the connection
object: the client's side (`Client`: its write, flow control, done, abort, tunnel and peer), what every
exchange shares (`Services`: the upstream pool, the clock, the deadlines, the recorder, the body memory, the
refusal counter) and, when there is one, the admission gate's decision (`Gate`). It asks the gate, sends the
request on a pooled upstream connection and relays the response from the upstream's `data_received` straight
to the client's write. A body the tap does not change goes out as the very bytes that came in, chunked framing
included; how the client's body is framed is http1.client_framing's decision, the outcome is
exporter.tap.outcomes', and the finished request's verdict exporter.tap.policy's. Deadlines towards the
engine are checked here (every tick of the proxy).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from exporter.logs import TAP_LOGGER, event
from exporter.tap import http1
from exporter.tap.deadlines import ANSWERED_GRACE_S, BODY_PROGRESS_BYTES, Deadlines
from exporter.tap.flow import FlowControl
from exporter.tap.http1 import CHUNKED, UNTIL_CLOSE, BadMessage, BodyMode, RequestHead, ResponseHead, field_text
from exporter.tap.objectives import Objective
from exporter.tap.outcomes import ended_outcome, left_outcome, outcome_for_status
from exporter.tap.policy import Finished, Forward, finish, gave_up
from exporter.tap.predict import REFUSAL_TEXT
from exporter.tap.relay import BodyRelay, Relay, SseRelay
from exporter.tap.timing import RequestTiming
from exporter.tap.upstream import UpstreamConnection, UpstreamPool
from llmslo import conventions as C

_UPSTREAM_FAILURES = (OSError, asyncio.TimeoutError, ssl.SSLError)
_JOINED_BODY_BYTES = 64 * 1024  # a request body up to this size is copied behind its head, to be sent in one write
_HOP_AND_LENGTH = http1.HOP_BY_HOP | {b"content-length"}  # what a response head re-framed by the tap drops


@dataclass(frozen=True, slots=True)
class Client:
    """The client's side of one connection, as its exchanges use it (exporter.tap.connection builds it)."""

    write: Callable[[bytes], None]  # bytes for the client, unless its transport is closing
    flow: FlowControl  # the client connection's flow control (write_paused: the client is not reading)
    done: Callable[[bool], None]  # the exchange is over; True: close the connection after it
    abort: Callable[[], None]  # reset the connection (a response broken off)
    tunnel: Callable[[], None]  # the upstream switched protocols: bytes pass both ways from now on
    peer: Callable[[], object]  # the client's address (the gate counts clients by it)


class Decision(Protocol):
    """The gate's decision for one request (exporter.tap.admission)."""

    @property
    def refusal(self) -> str: ...  # "" (admitted) or a conventions.REFUSED_ADMISSION_* reason

    @property
    def ticket(self) -> int: ...  # the admitted request's reservation, for `settle`

    @property
    def retry_after_s(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Gate:
    """The admission gate, as a request's cycle asks it: decide once before forwarding, settle once at the end."""

    decide: Callable[[Objective, RequestHead, object], Decision]  # objective, request head, client's peer
    settle: Callable[[int], None]  # the ticket of an admitted request that ended


@dataclass(frozen=True, slots=True)
class Services:
    """What every exchange of the tap shares (exporter.tap.proxy builds it once)."""

    pool: UpstreamPool
    clock: Callable[[], float]
    deadlines: Callable[[], Deadlines]  # the deadlines now (a reload changes them)
    record: Callable[[Finished], None]  # a timed request's end: metrics, observer, the gate's sizes
    release_body: Callable[[int], None]  # request body bytes no longer held (the tap-wide cap)
    refused: Callable[[str], None]  # count a refusal by its reason
    model_label: Callable[[str], str]  # a model's label value (exporter.tap.models)


class Exchange:
    """One request forwarded upstream and its response relayed back, with its timing."""

    # Where every exchange starts (class defaults: a new one sets only what is its own, once per request).
    progress_bytes = 0
    body_bytes = 0  # decoded response body bytes
    conn: UpstreamConnection | None = None
    task: asyncio.Task[None] | None = None
    done = False
    # Response state, set once its head arrives.
    rbuf = b""
    response: ResponseHead | None = None
    status = 0
    outcome = C.OUTCOME_OK
    streamed = False  # a timed SSE stream
    relay: Relay | None = None
    steady: tuple[http1.ChunkedDecoder, SseRelay] | None = None  # set by _respond for a chunked stream
    framing = 0  # body length, CHUNKED or UNTIL_CLOSE
    left = 0
    decoder: http1.ChunkedDecoder | None = None
    mode = BodyMode.RAW
    prefix = b""  # the response head, written with the first body bytes
    terminated = False  # the client already got the last-chunk marker
    tunnel = False  # switched protocols (101): bytes pass both ways unparsed
    ticket = 0  # the admission gate's reservation while the engine may not show this request yet

    def __init__(
        self, services: Services, client: Client, gate: Gate | None, head: RequestHead, fwd: Forward,
        arrival: float, reserved: int = 0,
    ) -> None:
        self.services = services
        self.clock = services.clock
        self.client = client
        self.write = client.write  # bound once: the per-chunk path calls it directly
        self.gate = gate
        self.head = head
        self.timing = RequestTiming(arrival)
        self.reserved = reserved  # body bytes counted against the tap-wide cap until the engine has them
        self.upgrade = fwd.upgrade
        self.plan = fwd.plan
        self.request_head, self.request_body = fwd.head, fwd.body  # `fwd` is not kept: the body is freed once sent
        self.client_close = fwd.client_close
        # The stall deadline runs from the last progress (exporter.tap.deadlines): a stream's last output
        # event (timing.last_token_at), a body's last BODY_PROGRESS_BYTES (progress_at, at body_bytes ==
        # progress_bytes), or the last time a client not reading excused the engine's silence.
        self.excused_at = arrival
        self.progress_at = arrival
        self.reusable = self.upgrade is None

    # -- forwarding ------------------------------------------------------------------------
    def start(self) -> None:
        gate = self.gate
        if self.plan is not None and gate is not None:
            verdict = gate.decide(self.plan.objective, self.head, self.client.peer())
            self.ticket = verdict.ticket
            if verdict.refusal:  # refused before anything reached the engine; admitted requests are never touched
                self.services.refused(verdict.refusal)
                why, seconds = REFUSAL_TEXT[verdict.refusal], verdict.retry_after_s
                self._fail(f"The engine is at capacity ({why}); retry after {seconds} s.", 429,
                           C.OUTCOME_REFUSED, retry_after=seconds, code=verdict.refusal)
                return
        conn = self.services.pool.take_idle()
        if conn is not None:
            self._send(conn)
        else:
            self.task = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        pool = self.services.pool
        try:
            conn = await pool.connect()
        except _UPSTREAM_FAILURES as e:
            self.task = None
            if not self.done:
                self._fail(f"upstream unreachable: {type(e).__name__}\n")
            return
        self.task = None
        if self.done:  # the client left while the tap was connecting: keep the fresh connection
            pool.release(conn, reusable=True)
            return
        self._send(conn)

    def _send(self, conn: UpstreamConnection) -> None:
        self.conn = conn
        conn.user = self
        assert conn.transport is not None
        head, body = self.request_head, self.request_body
        if len(body) <= _JOINED_BODY_BYTES:
            conn.transport.write(head + body)  # one send for the engine, not two
        else:
            conn.transport.write(head)
            conn.transport.write(body)
        self.request_head, self.request_body = b"", b""
        if self.client.flow.write_paused:  # the previous response has not drained yet
            self.pause_upstream()

    def _release_body(self) -> None:
        if self.reserved:
            self.services.release_body(self.reserved)
            self.reserved = 0

    def _fail(
        self, text: str, status: int = 502, outcome: str = C.OUTCOME_UPSTREAM_ERROR, retry_after: int | None = None,
        code: str = "",
    ) -> None:
        """No response from the upstream: answer with the tap's own error (502, 504 for a deadline, 429
        for an admission refusal): an OpenAI error object for the API's timed requests, else plain text."""
        self.timing.on_end(self.clock())
        self.status = status
        if self.plan is not None:
            kind = "rate_limit_exceeded" if status == 429 else "timeout" if status == 504 else "server_error"
            response = http1.json_error_response(status, text.strip(), kind, code or outcome, close=self.client_close,
                                                 retry_after=retry_after)
        else:
            response = http1.simple_response(status, text, close=self.client_close, retry_after=retry_after)
        self.write(response)
        self._finish(outcome, close=self.client_close)

    def check_deadline(self, now: float) -> None:
        """End the request as `upstream_timeout` once the engine kept it waiting past a deadline."""
        if self.done or self.tunnel:
            return
        if self.client.flow.write_paused:
            self.excused_at = now  # the client is not reading: the engine is not the one stalling
            return
        d = self.services.deadlines()
        plan = self.plan
        timing = self.timing
        if plan is not None and self.streamed and timing.complete:  # the answer is whole: only its transport's end
            one = timing.delivered or plan.choices == 1  # else other choices may still be streaming
            limit = min(ANSWERED_GRACE_S, d.stall_s) if one else d.stall_s
            since = max((timing.answered_at if timing.delivered else timing.answer_end) or now, self.excused_at)
            what = "end of the response after its answer"
        elif plan is not None and plan.streamed and timing.first_token_at is None:
            limit, since, what = max(d.first_token_s, plan.objective.ttft or 0.0), timing.arrival, "first token"
        elif self.response is None:
            limit, since, what = d.response_s, timing.arrival, "response"
        elif plan is None:
            return  # an untimed body (e.g. a long poll) once it has started: the client decides
        elif isinstance(self.relay, SseRelay) and self.relay.following and timing.last_token_at is not None:
            # Only output events are progress: keep-alive comments, blank lines and partial events are not.
            limit, since, what = d.stall_s, max(timing.last_token_at, self.excused_at), "next output event"
        elif not self.streamed and now - timing.arrival > d.response_s:
            limit, since, what = d.response_s, timing.arrival, "whole response"
        else:
            limit, since, what = d.stall_s, max(self.progress_at, self.excused_at), "next bytes of the response"
        if now - since > limit:
            self._timeout(what, limit)

    def _timeout(self, what: str, limit: float) -> None:
        self.reusable = False  # closing the upstream connection is how the engine learns of the abandon
        event("tap_upstream_timeout", logging.DEBUG, logger=TAP_LOGGER, waited_for=what.replace(" ", "_"),
              limit_s=f"{limit:g}", path=field_text(self.head.path))
        if self.response is None or self.prefix:  # the client has had nothing: answer 504
            self._fail(f"the engine sent no {what} within {limit:g} s\n", 504, C.OUTCOME_UPSTREAM_TIMEOUT)
        elif self.streamed and self.timing.complete:
            self._end_answered()
        else:  # the response has started: break it off, as for an upstream break
            self.timing.on_end(self.clock())
            self._finish(C.OUTCOME_UPSTREAM_TIMEOUT, close=True, abort=True)

    # -- upstream callbacks ----------------------------------------------------------------
    def upstream_data(self, data: bytes) -> None:
        if self.tunnel:
            self.write(data)
            return
        t = self.clock()
        if self.reserved:
            self._release_body()  # the engine answers: it has read the request
        if self.response is None:
            data = self._head(data, t)
            if not data or self.done:
                return
        steady = self.steady
        if steady is not None and not self.prefix:  # most reads of a stream: one whole chunk, one token event
            payload = steady[0].whole_chunk(data)
            if payload is not None:
                if not steady[1].steady(payload, t):
                    self._body(data, t, payload)  # decoded already: the decoder stays at a boundary
                    return
                body_bytes = self.body_bytes = self.body_bytes + len(payload)
                if body_bytes - self.progress_bytes >= BODY_PROGRESS_BYTES:
                    self.progress_at, self.progress_bytes = t, body_bytes
                self.write(data)  # as it came, framing included (what _body would send for it)
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
        self.write(head + rest)
        self.client.tunnel()

    def to_upstream(self, data: bytes) -> None:
        conn = self.conn
        if conn is not None and conn.transport is not None and not conn.transport.is_closing():
            conn.transport.write(data)

    def upstream_full(self, full: bool) -> None:
        """Tunnel backpressure the other way: a full upstream socket stops reading from the client."""
        if self.tunnel:
            self.client.flow.pause_reading() if full else self.client.flow.resume_reading()

    def _respond(self, head: ResponseHead, framing: int, t: float) -> None:
        self.response, self.status, self.framing = head, head.status, framing
        self.progress_at = t
        self.timing.on_headers(t)
        self.outcome = outcome_for_status(head.status)
        tokens = http1.connection_tokens(head.fields)
        if b"close" in tokens or head.version == b"1.0":
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
        client = http1.client_framing(framing, self.client_close, strip)
        self.mode = client.mode
        if isinstance(self.relay, SseRelay) and self.decoder is not None and self.mode is not BodyMode.PLAIN:
            self.steady = (self.decoder, self.relay)  # whole chunks may go out as they came: upstream_data's fast path
        drop = http1.HOP_BY_HOP if client.keep_length else _HOP_AND_LENGTH
        if tokens:
            drop = drop | tokens
        lines = [b"HTTP/1.1 %d %s\r\n" % (head.status, head.reason)]
        lines.extend(k + b": " + v + b"\r\n" for k, v in head.fields if k.lower() not in drop)
        lines.append(client.field)
        if self.client_close or self.mode is BodyMode.PLAIN:
            lines.append(b"Connection: close\r\n")
        lines.append(b"\r\n")
        self.prefix = b"".join(lines)

    def _body(self, data: bytes, t: float, whole: bytes | None = None) -> None:
        """Relay one read of the body; `whole`: its payload, when it is one whole chunk (ChunkedDecoder.whole_chunk)."""
        framing = self.framing
        decoder = self.decoder
        if whole is not None:
            boundary_before, used, raw, payload, finished = True, len(data), data, whole, False
        elif decoder is not None:
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
        body_bytes = self.body_bytes = self.body_bytes + len(payload)
        if body_bytes - self.progress_bytes >= BODY_PROGRESS_BYTES:
            self.progress_at, self.progress_bytes = t, body_bytes
        relay = self.relay
        out = relay.feed(payload, t) if relay is not None and payload else None
        mode = self.mode
        if mode is BodyMode.RAW:
            send = raw
        elif mode is BodyMode.CHUNKS:
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
        if finished:
            self._end(t, lead=send)  # the body's last bytes and its end go out in one write
        elif send:
            self.write(send)

    def _end_answered(self) -> None:
        """The stream's answer is whole (its [DONE], or its final finish_reason, came), but the upstream holds its
        connection open after it, or breaks it: the request is judged by its answer, timed to the answer's end,
        not failed by its transport. The client's response is ended where its framing allows (else closed) and
        the upstream connection closed (it is out of step)."""
        self.reusable = False
        timing = self.timing
        now = self.clock()
        end = timing.answer_end
        timing.on_end(now if end is None else end)
        decoder, mode = self.decoder, self.mode
        whole = mode is BodyMode.CHUNKS
        if mode is BodyMode.RAW and decoder is not None and decoder.at_boundary:
            self.write(self.prefix + http1.LAST_CHUNK)  # the upstream's own chunks end here
            self.prefix, whole = b"", True
        conn = self.conn
        if conn is not None and conn.transport is not None:
            conn.transport.close()
        self._end(now, close=not whole)

    def _end(self, t: float, close: bool = False, lead: bytes = b"") -> None:
        """The response body ended normally (`close`: the client's connection must close to end it; `lead`: bytes
        for the client not written yet, to go before the end)."""
        relay = self.relay
        tail = relay.finish(t) if relay is not None else b""
        if self.mode is BodyMode.CHUNKS:
            tail = (http1.chunk(tail) if tail else b"") + (b"" if self.terminated else http1.LAST_CHUNK)
        send = lead + self.prefix + tail if lead else self.prefix + tail
        if send:
            self.write(send)
        self.prefix = b""
        outcome = ended_outcome(
            self.outcome, error_event=relay is not None and relay.error_event,
            stream=isinstance(relay, SseRelay), complete=self.timing.complete,
            unparsed_close=isinstance(relay, BodyRelay) and self.framing == UNTIL_CLOSE and not relay.parsed,
        )
        self._finish(outcome, close=close or self.client_close or self.mode is BodyMode.PLAIN)

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
            self._end(self.clock())
        else:
            self._broken()

    def _broken(self) -> None:
        """The upstream broke off mid-body. Pass the break on: close the client's connection
        without the end of the body, as nginx does, so the client cannot mistake a truncated
        response for a complete one. A stream whose answer was already whole is ended as answered."""
        if self.streamed and self.timing.complete:
            self._end_answered()
            return
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
        self._finish(self._left_outcome(self.clock()), close=True)

    def late(self, now: float) -> bool:
        """Whether this timed request's objective is already lost at `now` while it is still owed
        something (exporter.tap.policy.gave_up): the in-flight-late gauge, and a leaving client's outcome."""
        plan = self.plan
        if plan is None or self.timing.complete:
            return False
        obj = plan.objective
        return gave_up(self.timing, now, obj.ttft, obj.tpot, plan.streamed, plan.cap)

    def _left_outcome(self, now: float) -> str:
        """The outcome of a request whose client went away before its response ended."""
        return left_outcome(self.outcome, complete=self.timing.complete, responded=self.response is not None,
                            gave_up=self.late(now))

    def pause_upstream(self) -> None:
        """The client's socket buffer is full: stop reading from the upstream (the engine's send then blocks)."""
        conn = self.conn
        if conn is not None:
            conn.flow.pause_reading()

    def resume_upstream(self) -> None:
        self.excused_at = self.clock()
        conn = self.conn
        if conn is not None:
            conn.flow.resume_reading()

    # -- the end ---------------------------------------------------------------------------
    def _finish(self, outcome: str, close: bool, abort: bool = False) -> None:
        if self.done:
            return
        self.done = True
        self._release_body()
        if self.ticket and self.gate is not None:
            self.gate.settle(self.ticket)
        self.request_head, self.request_body = b"", b""
        conn, self.conn = self.conn, None
        if conn is not None:
            complete = self.response is not None and self.rbuf == b"" and self.framing != UNTIL_CLOSE
            self.services.pool.release(conn, reusable=self.reusable and complete)
        plan = self.plan
        if plan is not None:
            services = self.services
            services.record(finish(self.head, plan, self.timing, outcome, self.status, self.streamed, self.body_bytes,
                                   services.model_label(plan.model)))
        if abort:
            self.client.abort()
        self.client.done(close)

