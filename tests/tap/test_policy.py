"""The tap's per-request decisions (exporter.tap.policy), called directly: no socket, no server, no clock."""

from __future__ import annotations

import json

import pytest

from exporter.tap import policy
from exporter.tap.classes import SloClass, SloConfig
from exporter.tap.http1 import RequestHead, parse_request_head
from exporter.tap.objectives import NOTHING, Asked, Objective
from exporter.tap.settings import TapSettings
from exporter.tap.timing import RequestTiming
from llmslo import conventions as C

SLO = SloConfig((SloClass("interactive", 0.5, 0.05, ("chat-*",)), SloClass("batch", 10.0, 1.0, ("batch-*",))), {})
PLAIN = TapSettings("http://engine:8000")
TRUSTING = TapSettings("http://engine:8000", trust_slo_headers=True)
CHAT = b"/v1/chat/completions"


def head(fields: list[tuple[bytes, bytes]] | None = None, method: bytes = b"POST", target: bytes = CHAT,
         version: bytes = b"1.1") -> RequestHead:
    return RequestHead(method, target, version, fields or [])


def forward(body: bytes, settings: TapSettings = PLAIN, **kw: object) -> policy.Forward:
    return policy.forward(head(**kw), body, True, SLO, settings, b"/base", b"engine:8000")  # type: ignore[arg-type]


# -- the plan: usage injection ---------------------------------------------------------------------------------
def test_a_stream_without_usage_is_asked_for_it_every_other_byte_as_the_client_wrote_it() -> None:
    body = b'{"model":"chat-a", "stream":true,"messages":[]}'
    fwd = forward(body)
    assert fwd.plan is not None and fwd.plan.inject_usage and fwd.plan.streamed
    assert fwd.body == b'{"stream_options":{"include_usage":true},"model":"chat-a", "stream":true,"messages":[]}'
    assert fwd.plan.request_bytes == len(fwd.body)


@pytest.mark.parametrize("body", [
    b'{"model":"chat-a","stream":true,"stream_options":{"include_usage":true}}',  # the client asked itself
    b'{"model":"chat-a","stream":false}',  # not streamed: usage comes in the body
    b'{"model":"chat-a"}',
])
def test_usage_is_not_injected_where_it_comes_anyway(body: bytes) -> None:
    fwd = forward(body)
    assert fwd.plan is not None and not fwd.plan.inject_usage
    assert fwd.body is body  # the very bytes, not a copy


def test_stream_options_without_usage_are_merged_not_replaced() -> None:
    fwd = forward(b'{"model":"chat-a","stream":true,"stream_options":{"continuous_usage_stats":false}}')
    assert fwd.plan is not None and fwd.plan.inject_usage
    assert json.loads(fwd.body)["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}


def test_injection_off_leaves_the_body_alone() -> None:
    body = b'{"model":"chat-a","stream":true}'
    fwd = forward(body, TapSettings("http://engine:8000", inject_usage=False))
    assert fwd.plan is not None and fwd.plan.streamed and not fwd.plan.inject_usage and fwd.body is body


def test_a_body_that_is_not_an_object_is_timed_under_the_fallback_class() -> None:
    fwd = forward(b"[1, 2]")
    assert fwd.plan is not None and (fwd.plan.model, fwd.plan.streamed, fwd.plan.inject_usage) == ("", False, False)
    assert fwd.plan.objective.slo_class == "interactive" and fwd.body == b"[1, 2]"


def test_the_plan_keeps_the_requests_bounds() -> None:
    fwd = forward(b'{"model":"batch-x","max_tokens":100,"n":3}')
    assert fwd.plan is not None
    assert (fwd.plan.model, fwd.plan.max_tokens, fwd.plan.choices, fwd.plan.cap) == ("batch-x", 100, 3, 300)
    assert fwd.plan.objective == Objective("batch", 10.0, 1.0)


# -- the plan: x-slo-* headers ---------------------------------------------------------------------------------
SLO_FIELDS = [(b"X-SLO-Class", b"batch"), (b"x-slo-ttft-ms", b"250"), (b"x-slo-tpot-ms", b"20")]


def test_untrusted_slo_headers_change_nothing() -> None:
    fwd = forward(b'{"model":"chat-a"}', PLAIN, fields=SLO_FIELDS)
    assert fwd.plan is not None and fwd.plan.objective == Objective("interactive", 0.5, 0.05)
    assert policy.slo_headers(head(SLO_FIELDS), trusted=False) is NOTHING


def test_trusted_slo_headers_pick_the_class_and_objectives_under_a_derived_class() -> None:
    fwd = forward(b'{"model":"chat-a"}', TRUSTING, fields=SLO_FIELDS)
    assert fwd.plan is not None
    assert fwd.plan.objective == Objective("batch@ttft250-tpot20", 0.25, 0.02, (), "batch")
    assert fwd.plan.objective.base_class == "batch"
    assert policy.slo_headers(head([*SLO_FIELDS, (b"x-other", b"1")]), trusted=True) == Asked("batch", 0.25, 0.02)


# -- which requests are timed, and the upstream head -----------------------------------------------------------
@pytest.mark.parametrize(("method", "target", "fields", "timed"), [
    (b"POST", CHAT, [], True),
    (b"POST", b"/v1/completions?x=1", [], True),
    (b"GET", CHAT, [], False),
    (b"POST", b"/v1/embeddings", [], False),
    (b"POST", CHAT, [(b"Connection", b"upgrade"), (b"Upgrade", b"websocket")], False),  # a tunnel is not timed
])
def test_only_completions_are_timed(method: bytes, target: bytes, fields: list[tuple[bytes, bytes]],
                                    timed: bool) -> None:
    fwd = forward(b'{"model":"chat-a"}', method=method, target=target, fields=fields)
    assert (fwd.plan is not None) is timed


def test_the_upstream_head_drops_connection_specific_fields_and_asks_for_identity() -> None:
    raw = (b"POST /v1/chat/completions?a=1 HTTP/1.1\r\nHost: tap:9000\r\nConnection: keep-alive, X-Hop\r\n"
           b"X-Hop: secret\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nExpect: 100-continue\r\n"
           b"Content-Length: 2\r\nAccept-Encoding: gzip\r\nAuthorization: Bearer k\r\nX-Request-Id: r1")
    fwd = policy.forward(parse_request_head(raw), b'{}', True, SLO, PLAIN, b"/base", b"engine:8000")
    assert fwd.head == (b"POST /base/v1/chat/completions?a=1 HTTP/1.1\r\nHost: engine:8000\r\n"
                        b"Authorization: Bearer k\r\nX-Request-Id: r1\r\nAccept-Encoding: identity\r\n"
                        b"Content-Length: 2\r\n\r\n")
    assert not fwd.client_close


def test_an_untimed_request_keeps_its_accept_encoding_and_a_bodiless_one_gets_no_length() -> None:
    fwd = policy.forward(head([(b"Accept-Encoding", b"gzip")], b"GET", b"/v1/models"), b"", False, SLO, PLAIN,
                         b"", b"engine")
    assert fwd.plan is None
    assert fwd.head == b"GET /v1/models HTTP/1.1\r\nHost: engine\r\nAccept-Encoding: gzip\r\n\r\n"


def test_an_upgrade_is_asked_for_again_and_relayed_as_a_tunnel() -> None:
    fields = [(b"Connection", b"Upgrade"), (b"Upgrade", b"websocket"), (b"Sec-WebSocket-Key", b"k")]
    fwd = policy.forward(head(fields, b"GET", b"/ws"), b"", False, SLO, PLAIN, b"", b"engine")
    assert fwd.upgrade == b"websocket" and fwd.plan is None
    assert fwd.head == (b"GET /ws HTTP/1.1\r\nHost: engine\r\nSec-WebSocket-Key: k\r\n"
                        b"Connection: upgrade\r\nUpgrade: websocket\r\n\r\n")


@pytest.mark.parametrize(("version", "fields", "close"), [
    (b"1.1", [], False), (b"1.0", [], True), (b"1.1", [(b"Connection", b"close")], True),
])
def test_the_client_connection_closes_after_http_1_0_or_connection_close(
        version: bytes, fields: list[tuple[bytes, bytes]], close: bool) -> None:
    assert forward(b'{"model":"chat-a"}', version=version, fields=fields).client_close is close


# -- the finished record and its goodput verdict -------------------------------------------------------------
PLAN = policy.Plan("chat-a", True, True, Objective("interactive", 0.5, 0.05), max_tokens=100, choices=1,
                   request_bytes=500)
HEAD = head([(b"X-Request-Id", b"abc")])


def stream(first: float, step: float, n: int, usage: int | None = None, prompt: int | None = None) -> RequestTiming:
    t = RequestTiming(arrival=0.0)
    t.on_headers(first / 2)
    for i in range(n):
        t.on_output_event(first + i * step)
    if usage is not None:
        t.on_usage(usage, prompt)
    t.on_end(first + n * step)
    return t


def test_ok_and_within_both_objectives_is_good() -> None:
    done = policy.finish(HEAD, PLAN, stream(0.4, 0.04, 5, usage=5, prompt=40), C.OUTCOME_OK, 200, True, 900,
                         "chat-a")
    r = done.record
    assert r.good and (r.request_id, r.path, r.model, r.slo_class, r.usage_injected) == (
        "abc", "/v1/chat/completions", "chat-a", "interactive", True)
    assert r.timings.ttft == pytest.approx(0.4) and r.timings.tpot == pytest.approx(0.04)
    assert done.rejected_usage is None and done.size == (40, 5)


def test_ok_but_ttft_over_the_objective_is_not_good() -> None:
    assert not policy.finish(HEAD, PLAN, stream(0.51, 0.01, 5), C.OUTCOME_OK, 200, True, 900, "m").record.good


def test_ok_but_tpot_over_the_objective_is_not_good() -> None:
    assert not policy.finish(HEAD, PLAN, stream(0.1, 0.051, 5), C.OUTCOME_OK, 200, True, 900, "m").record.good


@pytest.mark.parametrize("outcome", [C.OUTCOME_UPSTREAM_ERROR, C.OUTCOME_TRUNCATED, C.OUTCOME_UPSTREAM_TIMEOUT])
def test_a_failed_outcome_is_never_good_nor_learned_as_a_size(outcome: str) -> None:
    done = policy.finish(HEAD, PLAN, stream(0.1, 0.01, 5, usage=5, prompt=40), outcome, 200, True, 900, "m")
    assert not done.record.good and done.record.outcome == outcome and done.size is None


def test_implausible_usage_falls_back_to_the_output_events() -> None:
    timing = stream(0.1, 0.01, 3, usage=10_000, prompt=40)  # above max_tokens (100)
    done = policy.finish(HEAD, PLAN, timing, C.OUTCOME_OK, 200, True, 900, "m")
    assert done.rejected_usage == 10_000 and done.size is None
    assert (done.record.timings.n_out, done.record.timings.usage_source) == (3, C.USAGE_SOURCE_CHUNKS)
    assert done.record.timings.tpot == pytest.approx(0.01)  # over the 3 events, not 10,000 tokens
    assert timing.usage_tokens == 10_000  # the judgement leaves the request's timing as it was


def test_a_prompt_count_far_beyond_the_request_bytes_is_not_a_size() -> None:
    over = PLAN.request_bytes + policy.PROMPT_TOKENS_OVER_BYTES
    assert policy.finish(HEAD, PLAN, stream(0.1, 0.01, 3, 3, over), C.OUTCOME_OK, 200, True, 900, "m").size == (over, 3)
    assert policy.finish(HEAD, PLAN, stream(0.1, 0.01, 3, 3, over + 1), C.OUTCOME_OK, 200, True, 900, "m").size is None


def test_goodput_needs_both_objectives_on_their_edges() -> None:
    r = stream(0.4, 0.1, 2).result()  # ttft 0.4, tpot 0.1

    def good(ttft: float | None, tpot: float | None) -> bool:
        return policy.good(C.OUTCOME_OK, r, Objective("c", ttft, tpot), streamed=True)

    assert good(0.4, 0.1)  # both on the edge: le semantics, like the histogram
    assert not good(0.39, 0.1) and not good(0.4, 0.09)
    assert good(None, 0.1) and good(0.4, None)
    no_token = RequestTiming(arrival=0.0).result()
    assert not policy.good(C.OUTCOME_OK, no_token, Objective("c", 10.0, 10.0), streamed=True)
    one_token = stream(0.4, 0.0, 1).result()
    assert policy.good(C.OUTCOME_OK, one_token, Objective("c", 0.4, 0.001), streamed=True)  # no TPOT to fail


def test_a_non_streamed_response_is_held_to_the_implied_deadline() -> None:
    t = RequestTiming(arrival=0.0)
    t.on_usage(11)
    t.on_end(1.0)
    r = t.result(streamed=False)

    def good(ttft: float | None, tpot: float | None) -> bool:
        return policy.good(C.OUTCOME_OK, r, Objective("c", ttft, tpot), streamed=False)

    assert good(0.5, 0.05)  # deadline 0.5 + 10 x 0.05 = 1.0
    assert not good(0.5, 0.04)
    assert good(None, 0.01)  # no TTFT objective: no deadline
    empty = RequestTiming(arrival=0.0)
    empty.on_end(0.1)
    assert not policy.good(C.OUTCOME_OK, empty.result(streamed=False), Objective("c", 1.0, 1.0), streamed=False)
