"""The tap's per-request decisions, as pure functions of values: no socket, no clock, no server object.

Before forwarding (`forward`): whether the request is timed, what it is held to and whether the tap asks the
engine for usage (its `Plan`), and the request head as sent upstream. After it (`finish`): the request's
Timings, whether its usage count is believed, its goodput verdict (llmslo.goodput) and its `RequestRecord`.
During it (`gave_up`): whether a client that leaves now was already failed. The request's cycle
(exporter.tap.exchange) does the I/O around these; tests/tap/test_policy.py calls them directly.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass

from exporter.tap import http1
from exporter.tap.classes import SloConfig
from exporter.tap.http1 import RequestHead, field_text
from exporter.tap.objectives import NOTHING, Asked, Objective, read_asked
from exporter.tap.request_fields import RequestFields, read_fields
from exporter.tap.settings import TapSettings
from exporter.tap.timing import RequestTiming, Timings
from llmslo import conventions as C
from llmslo.goodput import response_deadline, response_good, streamed_good

TIMED_PATHS = frozenset({b"/v1/chat/completions", b"/v1/completions"})
# A prompt's tokens beyond its request's bytes (a chat template, an image's tokens from a short URL) that a
# usage.prompt_tokens may still claim; a larger count is not believed for the seat estimate (a lying engine
# could otherwise inflate the footprint and close the gate).
PROMPT_TOKENS_OVER_BYTES = 65_536
_DROP_REQUEST = http1.HOP_BY_HOP | {b"host", b"content-length", b"expect"}


@dataclass(frozen=True, slots=True)
class Plan:
    """What the tap decided about one timed request before forwarding it."""

    model: str
    streamed: bool
    inject_usage: bool
    objective: Objective
    max_tokens: int | None = None  # per choice, from the request
    choices: int = 1  # the request's `n`
    request_bytes: int = 0  # the body's length as sent (the body itself is freed once sent)

    @property
    def cap(self) -> int | None:
        """The most output tokens the request allows over all its choices (None: no max_tokens)."""
        return None if self.max_tokens is None else self.max_tokens * self.choices


@dataclass(frozen=True, slots=True)
class Forward:
    """One request as the tap forwards it: its plan (None: not timed), what goes upstream, how its client's
    connection ends. The cycle takes the body out and keeps no reference to this object, so the body is freed
    once sent."""

    plan: Plan | None
    head: bytes  # the request head as sent upstream
    body: bytes | bytearray
    upgrade: bytes | None  # the protocol the client asked to switch to (asked again upstream)
    client_close: bool  # the client's connection closes after this response (HTTP/1.0 or `Connection: close`)


def forward(head: RequestHead, body: bytes | bytearray, has_body: bool, slo: SloConfig, settings: TapSettings,
            prefix: bytes, host: bytes) -> Forward:
    """The request as sent to the engine at `host` (its Host field) under path `prefix`, and its plan."""
    connection = http1.connection_tokens(head.fields)
    upgrade = head.get(b"upgrade") if b"upgrade" in connection else None
    timed = head.method == b"POST" and head.path in TIMED_PATHS and upgrade is None
    p = None
    if timed:
        p, body = plan(head, body, slo, settings)
    sent = upstream_head(head, len(body), has_body, timed, connection, prefix, host, upgrade)
    return Forward(p, sent, body, upgrade, head.version == b"1.0" or b"close" in connection)


def slo_headers(head: RequestHead, trusted: bool) -> Asked:
    """What the request's x-slo-* fields ask for (bounded: exporter.tap.objectives) when the gateway in front is
    trusted (--trusted-gateway-objectives); else nothing, whatever the client sent."""
    if not trusted:
        return NOTHING
    return read_asked((k.lower().decode("latin-1"), v.decode("latin-1")) for k, v in head.fields
                      if k[:6].lower() == b"x-slo-")


def plan(head: RequestHead, body: bytes | bytearray, slo: SloConfig,
         settings: TapSettings) -> tuple[Plan, bytes | bytearray]:
    """A timed request's plan and the body to send (the client's own, or one asking for usage)."""
    headers = slo_headers(head, settings.trust_slo_headers)
    f = read_fields(body)
    if not f.is_object:
        return Plan("", False, False, slo.resolve(headers, "")), body
    inject = f.stream and settings.inject_usage and not f.include_usage
    if inject:
        body = with_include_usage(body, f)
    return Plan(f.model, f.stream, inject, slo.resolve(headers, f.model), f.max_tokens, f.choices, len(body)), body


def with_include_usage(body: bytes | bytearray, f: RequestFields) -> bytes:
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


def upstream_head(head: RequestHead, body_length: int, has_body: bool, timed: bool, connection: set[bytes],
                  prefix: bytes, host: bytes, upgrade: bytes | None = None) -> bytes:
    """The request head as sent upstream: the client's fields minus connection-specific ones
    (those `connection`, the client's Connection options, names too; but an upgrade, e.g. to
    WebSocket, is asked for again: the tap relays it as a tunnel). The body follows it as it is."""
    drop = _DROP_REQUEST | connection
    if timed:
        drop = drop | {b"accept-encoding"}
    lines = [b"%s %s%s HTTP/1.1\r\nHost: %s\r\n" % (head.method, prefix, http1.origin_form(head.target), host)]
    lines.extend(k + b": " + v + b"\r\n" for k, v in head.fields if k.lower() not in drop)
    if timed:
        lines.append(b"Accept-Encoding: identity\r\n")  # the tap must read the stream it times
    if has_body:
        lines.append(b"Content-Length: %d\r\n" % body_length)
    if upgrade is not None:
        lines.append(b"Connection: upgrade\r\nUpgrade: %s\r\n" % upgrade)
    lines.append(b"\r\n")
    return b"".join(lines)


@dataclass(frozen=True)
class RequestRecord:
    """One timed request as the tap saw it; given to the optional observer (tests, debugging)."""

    request_id: str  # the client's x-request-id header, "" when absent
    path: str
    model: str  # the model's label value (exporter.tap.models)
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


@dataclass(frozen=True, slots=True)
class Finished:
    """A timed request's end: its record, and what the tap learned from it besides."""

    record: RequestRecord
    plan: Plan
    body_bytes: int  # the response body's decoded bytes
    rejected_usage: int | None  # the engine's completion_tokens when not believed (n_out fell back to events)
    size: tuple[int, int] | None  # (prompt, completion tokens) exact and believable: the seat estimate's sizes


def finish(head: RequestHead, plan: Plan, timing: RequestTiming, outcome: str, status: int, streamed: bool,
           body_bytes: int, model: str) -> Finished:
    """The finished request judged: `model` is its label value; `timing` is left as it is."""
    n = timing.usage_tokens
    rejected = n if n is not None and not plausible_usage(n, plan.max_tokens, plan.choices, body_bytes) else None
    if rejected is not None:
        timing = dataclasses.replace(timing, usage_tokens=None)  # n_out falls back to the output events counted
    t = timing.result(streamed=streamed)
    obj = plan.objective
    verdict = good(outcome, t, obj, streamed)
    prompt, completion = timing.usage_prompt_tokens, timing.usage_tokens
    size = None
    if outcome == C.OUTCOME_OK and completion is not None and prompt is not None \
            and prompt <= plan.request_bytes + PROMPT_TOKENS_OVER_BYTES:
        size = (prompt, completion)
    record = RequestRecord(field_text(head.get(b"x-request-id")), field_text(head.path), model, obj.slo_class,
                           streamed, plan.inject_usage, outcome, status, t, verdict, obj, timing.arrival)
    return Finished(record, plan, body_bytes, rejected, size)


def good(outcome: str, t: Timings, objective: Objective, streamed: bool) -> bool:
    """The goodput verdict (llmslo.goodput): ok, and within both of the request's objectives."""
    if outcome != C.OUTCOME_OK:
        return False
    if streamed:
        return streamed_good(t.ttft, t.tpot, objective.ttft, objective.tpot)
    return response_good(t.e2e, t.n_out, objective.ttft, objective.tpot)


def plausible_usage(n: int, max_tokens: int | None, choices: int, body_bytes: int) -> bool:
    """Whether an engine-reported completion_tokens count can be true.

    It cannot exceed what the request allowed (max_tokens per choice, `n` choices) nor the
    bytes of the response that carried it: every output token costs a streamed event (or at
    least a byte of text) on the wire, so more tokens than bytes means a broken or lying
    upstream (e.g. `"completion_tokens": 1e23`), whose count would inflate goodput tokens.
    """
    if max_tokens is not None and n > max_tokens * max(choices, 1):
        return False
    return n <= max(body_bytes, 1)


def gave_up(t: RequestTiming, now: float, ttft_max: float | None, tpot_max: float | None, streamed: bool,
            max_tokens: int | None) -> bool:
    """Whether a client that left at `now` left only after its objective could no longer be met.

    Such a client was failed by the service (it usually stopped waiting for a hung or far too
    slow engine), so it counts against the SLIs; one that left while still on time did not.

    Streamed: no output yet and the TTFT objective has passed; or the first token came after
    it; or the stream as the client saw it was slower than the TPOT objective: with k output
    events delivered, (now - first token) / k > TPOT objective (the next token could not have
    come before `now`). Not streamed: the response could no longer arrive by the time a good
    one must (llmslo.goodput.response_deadline for `max_tokens` tokens); without max_tokens and
    with a TPOT objective, that time is unbounded, so never.
    """
    waited = now - t.arrival
    if streamed:
        if t.first_token_at is None:
            return ttft_max is not None and waited > ttft_max
        if ttft_max is not None and t.first_token_at - t.arrival > ttft_max:
            return True
        return tpot_max is not None and (now - t.first_token_at) / max(t.output_events, 1) > tpot_max
    if tpot_max and max_tokens is None:
        return False
    deadline = response_deadline(ttft_max, tpot_max, 1 if max_tokens is None else max_tokens)
    return deadline is not None and waited > deadline
