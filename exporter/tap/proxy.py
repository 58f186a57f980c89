"""The goodput tap: an HTTP reverse proxy that relays bytes unchanged and times completions.

Every request is forwarded to the upstream engine and every response byte is relayed as it
arrives (`await resp.write()` per read, so a slow client pushes back on the upstream through
aiohttp's flow control instead of filling memory). Only POST /v1/chat/completions and
/v1/completions are timed; everything else (/metrics, /v1/models, /health, ...) passes
through untouched.

For a streamed completion whose client did not ask for usage, the tap asks the upstream for
it (`stream_options.include_usage`) so n_out is the engine's token count, and drops the one
extra event that produces (empty `choices` plus `usage`) before the client sees it; the
client then gets the bytes it would have got without the injection. Request and response
contents are never logged or stored.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from exporter.tap.classes import Objective, SloConfig
from exporter.tap.metrics import TapMetrics
from exporter.tap.sse import EventTooLarge, SseSplitter
from exporter.tap.timing import (
    RequestTiming,
    Timings,
    carries_output,
    completion_tokens,
    is_usage_only,
    within_objectives,
)
from llmslo import conventions as C

log = logging.getLogger("llmslo.tap")

TIMED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_PARSED_RESPONSE_BYTES = 8 * 1024 * 1024  # a non-streamed body larger than this is relayed but not parsed

# RFC 9110 7.6.1: connection-specific headers a proxy must not forward.
_HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
        "trailer", "trailers", "transfer-encoding", "upgrade",
    }
)
_DROP_REQUEST = _HOP_BY_HOP | {"host", "content-length"}
_DONE = b"[DONE]"
_USAGE_KEY = b'"usage"'
_ERROR_KEY = b'"error"'
_UPSTREAM_FAILURES = (aiohttp.ClientError, OSError, asyncio.TimeoutError)
# Request-dict key: when the request was read (a typed key where aiohttp has them).
_ARRIVAL: Any = web.RequestKey("llmslo_tap_arrival", float) if hasattr(web, "RequestKey") else "llmslo_tap_arrival"
_BROKEN = "broken"  # the upstream connection broke off mid-body
_ERROR_EVENT = "error_event"  # the stream carried an error event: the engine gave up mid-stream


@dataclass(frozen=True)
class TapSettings:
    upstream: str  # base URL of the engine, e.g. http://127.0.0.1:8000
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    inject_usage: bool = True
    connect_timeout_s: float = 10.0


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
    body: bytes
    objective: Objective


def _outcome_for_status(status: int) -> str:
    if status >= 500 or status == 429:  # 429: the engine is out of capacity, which an SLO must see
        return C.OUTCOME_UPSTREAM_ERROR
    if status >= 400:
        return C.OUTCOME_CLIENT_ERROR
    return C.OUTCOME_OK


def _with_include_usage(body: bytes, doc: dict[str, Any]) -> bytes:
    """The request body asking for usage. When `stream_options` is absent the key is spliced in
    after the opening brace, leaving every other byte as the client wrote it."""
    if "stream_options" not in doc:
        brace = body.index(b"{")
        return body[: brace + 1] + b'"stream_options":{"include_usage":true},' + body[brace + 1 :] if doc else (
            b'{"stream_options":{"include_usage":true}}'
        )
    opts = doc["stream_options"]
    doc = dict(doc, stream_options={**(opts if isinstance(opts, dict) else {}), "include_usage": True})
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


class _BodyTooLarge(Exception):
    pass


class TapProxy:
    """The aiohttp handler and its upstream client session."""

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
        self._base = URL(settings.upstream.rstrip("/"))
        self._session: aiohttp.ClientSession | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,  # relay the upstream's bytes, compressed or not
            timeout=aiohttp.ClientTimeout(total=None, connect=self.settings.connect_timeout_s),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def make_app(self) -> web.Application:
        # client_max_size is enforced by _read_body (streamed, with a 413), not by aiohttp.
        app = web.Application(client_max_size=self.settings.max_body_bytes + 1)
        _stamp_arrivals(app, self.clock)
        app.router.add_route("*", "/{tail:.*}", self.handle)

        async def _ctx(_: web.Application):
            await self.open()
            yield
            await self.close()

        app.cleanup_ctx.append(_ctx)
        return app

    # -- request side ----------------------------------------------------------------------
    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise _BodyTooLarge
        if not request.body_exists:
            return b""
        parts: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise _BodyTooLarge
            parts.append(chunk)
        return b"".join(parts)

    def _plan(self, request: web.Request, body: bytes) -> _Plan:
        doc: Any = None
        try:
            doc = json.loads(body) if body else None
        except (ValueError, UnicodeDecodeError):
            pass
        if not isinstance(doc, dict):
            return _Plan("", False, False, body, self.slo.resolve(request.headers, ""))
        model = doc.get("model")
        model = model if isinstance(model, str) else ""
        streamed = doc.get("stream") is True
        opts = doc.get("stream_options")
        asked = isinstance(opts, dict) and opts.get("include_usage") is True
        inject = streamed and self.settings.inject_usage and not asked
        if inject:
            body = _with_include_usage(body, doc)
        return _Plan(model, streamed, inject, body, self.slo.resolve(request.headers, model))

    def _upstream_headers(self, request: web.Request, timed: bool) -> CIMultiDict[str]:
        headers: CIMultiDict[str] = CIMultiDict()
        for k, v in request.headers.items():
            if k.lower() not in _DROP_REQUEST:
                headers.add(k, v)
        if timed:
            headers["Accept-Encoding"] = "identity"  # the tap must read the stream it times
        return headers

    # -- the handler -----------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        arrival = request.get(_ARRIVAL) or self.clock()
        try:
            body = await self._read_body(request)
        except _BodyTooLarge:
            resp = web.Response(
                status=413, text=f"request body larger than the tap's limit of {self.settings.max_body_bytes} bytes\n"
            )
            resp.force_close()
            return resp
        timed = request.method == "POST" and request.path in TIMED_PATHS
        plan = self._plan(request, body) if timed else None
        return await self._forward(request, body if plan is None else plan.body, plan, arrival)

    async def _forward(
        self, request: web.Request, body: bytes, plan: _Plan | None, arrival: float
    ) -> web.StreamResponse:
        assert self._session is not None, "TapProxy.open() was not awaited"
        timing = RequestTiming(arrival)
        url = self._base.with_path(self._base.path.rstrip("/") + request.raw_path, encoded=True)
        try:
            upstream = await self._session.request(
                request.method,
                url,
                headers=self._upstream_headers(request, plan is not None),
                data=body if body or request.body_exists else None,
                allow_redirects=False,
            )
        except asyncio.CancelledError:
            self._finish(request, plan, timing, C.OUTCOME_CLIENT_DISCONNECTED, 0, False)
            raise
        except _UPSTREAM_FAILURES as e:
            timing.on_end(self.clock())
            self._finish(request, plan, timing, C.OUTCOME_UPSTREAM_ERROR, 502, False)
            return web.Response(status=502, text=f"upstream unreachable: {type(e).__name__}\n")

        timing.on_headers(self.clock())
        status = upstream.status
        outcome = _outcome_for_status(status)
        stream_parsed = (
            plan is not None and plan.streamed and upstream.headers.get("Content-Type", "").startswith("text/event-stream")
        )
        strip = stream_parsed and plan is not None and plan.inject_usage
        resp = web.StreamResponse(status=status, reason=upstream.reason)
        for k, v in upstream.headers.items():
            kl = k.lower()
            if kl not in _HOP_BY_HOP and not (strip and kl == "content-length"):
                resp.headers.add(k, v)
        try:
            await resp.prepare(request)
            if stream_parsed:
                broke = await self._relay_sse(upstream, resp, timing, strip)
            elif plan is not None:
                broke = await self._relay_body(upstream, resp, timing)
            else:
                broke = await self._relay_plain(upstream, resp)
            if broke is not None:
                outcome = C.OUTCOME_ABORTED
            if broke == _BROKEN:
                # Pass the break on: close the client's connection without the final chunk, as
                # nginx does, so the client cannot mistake a truncated stream for a complete one.
                upstream.close()
                if request.transport is not None:
                    request.transport.abort()
                return resp
            await resp.write_eof()
            return resp
        except ConnectionResetError:
            # Writing to a client that left (aiohttp's ClientConnectionResetError is one too).
            outcome = outcome if timing.delivered else C.OUTCOME_CLIENT_DISCONNECTED
            upstream.close()  # closes the upstream connection: the engine sees the abort
            return resp
        except asyncio.CancelledError:
            # aiohttp cancels the handler when the client's connection is lost.
            outcome = outcome if timing.delivered else C.OUTCOME_CLIENT_DISCONNECTED
            upstream.close()
            raise
        finally:
            upstream.release()
            self._finish(request, plan, timing, outcome, status, stream_parsed)

    # -- relays: each returns None when the body ended normally, else why it did not -----
    async def _relay_plain(self, upstream: aiohttp.ClientResponse, resp: web.StreamResponse) -> str | None:
        """Untimed paths: bytes in, bytes out."""
        read = upstream.content.readany
        while True:
            try:
                chunk = await read()
            except _UPSTREAM_FAILURES:
                return _BROKEN
            if not chunk:
                return None
            await resp.write(chunk)  # a client that left raises here, out to _forward

    async def _relay_body(
        self, upstream: aiohttp.ClientResponse, resp: web.StreamResponse, timing: RequestTiming
    ) -> str | None:
        """A timed, non-streamed response: relay it, then read usage from the body (E2E only)."""
        read = upstream.content.readany
        parts: list[bytes] = []
        kept = 0
        while True:
            try:
                chunk = await read()
            except _UPSTREAM_FAILURES:
                return _BROKEN
            if not chunk:
                break
            if kept <= MAX_PARSED_RESPONSE_BYTES:
                parts.append(chunk)
                kept += len(chunk)
            await resp.write(chunk)
        timing.on_end(self.clock())
        if kept <= MAX_PARSED_RESPONSE_BYTES:
            try:
                n = completion_tokens(json.loads(b"".join(parts)))
            except (ValueError, UnicodeDecodeError):
                n = None
            if n is not None:
                timing.on_usage(n)
        return None

    async def _relay_sse(
        self, upstream: aiohttp.ClientResponse, resp: web.StreamResponse, timing: RequestTiming, strip: bool
    ) -> str | None:
        """A timed stream: time each event as the read that completes it returns, relay the bytes.

        Without `strip`, each read is written as it came. With `strip` (usage was injected),
        only complete events are written, minus the injected usage event.
        """
        read = upstream.content.readany
        write = resp.write
        splitter: SseSplitter | None = SseSplitter()
        clock = self.clock
        loads = json.loads
        error_event = False
        while True:
            try:
                chunk = await read()
            except _UPSTREAM_FAILURES:
                return _BROKEN
            if not chunk:
                break
            t = clock()
            if splitter is None:  # gave up following the stream: relay blindly
                await write(chunk)
                continue
            held = splitter.pending()  # fed earlier, not written yet (with strip)
            whole = not held  # this read starts at an event boundary
            if whole and timing.first_token_at is not None:
                data = _steady_event_data(chunk)
                if data is not None:  # the common read: one token, nothing to parse or strip
                    if _looks_like_output(data):
                        timing.on_output_event(t)
                    await write(chunk)
                    continue
            try:
                events = splitter.feed(chunk)
            except EventTooLarge:
                log.warning("event=tap_stream_unparseable reason=event_too_large")
                splitter = None
                await resp.write(held + chunk if strip else chunk)
                continue
            out: list[bytes] | None = [] if strip else None
            changed = False
            done = False
            for ev in events:
                data = ev.data
                done = done or data == _DONE
                if data is not None and data != _DONE:
                    # After the first token only the last token's time and the count are
                    # still open, so parse only events that may carry usage or an error.
                    if timing.first_token_at is None or _USAGE_KEY in data or _ERROR_KEY in data:
                        try:
                            payload = loads(data)
                        except (ValueError, UnicodeDecodeError):
                            payload = None
                        if isinstance(payload, dict):
                            if carries_output(payload):
                                timing.on_output_event(t)
                            n = completion_tokens(payload)
                            if n is not None:
                                timing.on_usage(n)
                                if strip and is_usage_only(payload):
                                    changed = True
                                    continue  # the injected usage event: not for the client
                            if payload.get("error"):
                                error_event = True
                    elif _looks_like_output(data):
                        timing.on_output_event(t)
                if out is not None:
                    raw = _without_null_usage(ev.raw)
                    changed = changed or raw is not ev.raw
                    out.append(raw)
            if out is None or (whole and not changed and not splitter.pending()):
                await write(chunk)  # nothing held back or dropped: the read as it came
            elif out:
                await write(b"".join(out))
            if done:
                timing.on_end(t)
                timing.delivered = True
        timing.on_end(clock())
        if strip and splitter is not None and splitter.pending():
            await resp.write(splitter.pending())  # an unterminated tail: relay it as it came
        return _ERROR_EVENT if error_event else None

    # -- accounting ------------------------------------------------------------------------
    def _finish(
        self, request: web.Request, plan: _Plan | None, timing: RequestTiming, outcome: str, status: int, streamed: bool
    ) -> None:
        if plan is None:
            return
        t = timing.result(streamed=streamed)
        obj = plan.objective
        good = outcome == C.OUTCOME_OK and within_objectives(t, obj.ttft, obj.tpot, streamed=streamed)
        model = self.metrics.model_label(plan.model) if self.metrics is not None else plan.model
        if self.metrics is not None:
            self.metrics.record(model, obj.slo_class, outcome, t, good)
        if self.observer is not None:
            record = RequestRecord(
                request.headers.get("x-request-id", ""), request.path, model, obj.slo_class, streamed,
                plan.inject_usage, outcome, status, t, good, obj, timing.arrival,
            )
            try:
                self.observer(record)
            except Exception:  # an observer's bug must not break the relay
                log.exception("event=tap_observer_failed")


_NULL_USAGE = (b',"usage":null}', b', "usage": null}')


def _without_null_usage(raw: bytes) -> bytes:
    """An injected stream's event as the engine would have sent it without the injection.

    Asked for usage, OpenAI's API (and the simulator) also add `"usage":null` to every chunk, as
    the top-level object's last member; that member is removed again. Only a one-line event
    whose data ends with it is touched (the brace after it closes the top-level object, so the
    member is the top level's); anything else is returned as it is, the same object.
    """
    body = raw.rstrip(b"\r\n")
    for tail in _NULL_USAGE:
        if body.endswith(tail) and body.count(b"\n") == 0 and b"\r" not in body:
            cut = len(body) - len(tail)
            return body[:cut] + b"}" + raw[len(body) :]
    return raw


def _stamp_arrivals(app: web.Application, clock: Callable[[], float]) -> None:
    """Read the clock when aiohttp builds each request rather than when the handler starts.

    Before Python 3.12 the handler runs in a new task, one event-loop pass later, behind
    whatever else is ready; on a busy tap that pass is time the client waited but the tap
    would not count. Uses aiohttp's request factory hook; without it the handler's own
    clock reading is the fallback.
    """
    make = getattr(app, "_make_request", None)
    if make is None:
        return

    def stamped(*args: Any, **kwargs: Any) -> web.Request:
        request = make(*args, **kwargs)
        request[_ARRIVAL] = clock()
        return request

    app._make_request = stamped  # type: ignore[method-assign]


def _steady_event_data(chunk: bytes) -> bytes | None:
    """The data field of a read that is exactly one one-line `data:` event ending in LF LF, when
    that data needs no parsing once the first token is known (no `[DONE]`, no `"usage"` key, which
    also rules out the `"usage":null` tail `_without_null_usage` strips, no `"error"` key); else None.

    Most reads of a stream are such a token event. Fed to an empty SseSplitter, such a read
    (with no CR in it) comes back as that one event, whole, and leaves the splitter empty, so the
    relay loop may skip the splitter, the event list and the per-event bookkeeping for it.
    """
    if not (chunk.startswith(b"data:") and chunk.endswith(b"\n\n")):
        return None
    data = chunk[5:-2]
    if b"\n" in data or b"\r" in data or _USAGE_KEY in data or _ERROR_KEY in data:
        return None
    if data[:1] == b" ":
        data = data[1:]
    return None if data == _DONE else data


def _looks_like_output(data: bytes) -> bool:
    """Cheap test, after the first token, for an event that carries output.

    Parsing every event costs more than relaying it; after the first token only the last
    token's time and the chunk count are still needed. An event that has a non-empty string
    value after `"content":`, `"text":`, a reasoning key, or a `"tool_calls"` key is output;
    anything else (role-only, finish-only) is not. Falls back to parsing when unsure.
    """
    for key in (b'"content":"', b'"text":"', b'"reasoning_content":"', b'"reasoning":"'):
        i = data.find(key)
        if i >= 0 and data[i + len(key) : i + len(key) + 1] != b'"':
            return True
    if b'"tool_calls"' in data or b'": "' in data or b'":\t' in data or b'":\n' in data:
        try:
            return carries_output(json.loads(data))
        except (ValueError, UnicodeDecodeError):
            return False
    return False
