"""The per-chunk fast path (ChunkedDecoder.whole_chunk + SseRelay.steady, taken by Exchange.upstream_data and by
SseRelay.feed) does exactly what the general path (ChunkedDecoder.feed + the splitter's way through SseRelay.feed)
does for the reads it takes, and takes none that the general path would change, hold or parse; and the page's
pieces join to the page."""

from __future__ import annotations

import copy

import pytest

from exporter.tap import http1
from exporter.tap.exposition import PIECE_BYTES, PageRenderer, pieces
from exporter.tap.metrics import TapMetrics
from exporter.tap.relay import SseRelay
from exporter.tap.timing import RequestTiming, Timings
from tests.tap.test_exposition import CONFIG

TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}],"t":1}\n\n'
EVENTS = [
    TOKEN,
    TOKEN.replace(b"data: ", b"data:"),
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason": "length"}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"content":"x"}}],"usage":null}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n',
    b'data: {"error":{"message":"engine died"}}\n\n',
    b"data: [DONE]\n\n",
    b"data:[DONE]\n\n",
    b"data:  [DONE]\n\n",
    b"data:\n\n",
    b'data: {"choices":[{"delta":{"content":"a"}}]}\r\n\r\n',
    b'data: {"choices":[{"delta":{"content":"a"}}]}\ndata: {"x":1}\n\n',
    b': keep-alive\n\n',
    b'event: x\ndata: {"choices":[{"delta":{"content":"a"}}]}\n\n',
    TOKEN + TOKEN,
    TOKEN[:20],
    b'data: {"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}\n\n',
    b'data: {"choices":[{"delta":{"content": "spaced"}}]}\n\n',
]
FRAMINGS = [
    lambda e: http1.chunk(e),
    lambda e: b"%X\r\n%s\r\n" % (len(e), e),  # upper-case hex
    lambda e: b"%x;ext=1\r\n%s\r\n" % (len(e), e),  # an extension: not whole_chunk's
    lambda e: b"0%x\r\n%s\r\n" % (len(e), e),  # a leading zero
    lambda e: http1.chunk(e)[:-1],  # cut short
    lambda e: http1.chunk(e) + b"0\r\n\r\n",  # with the last chunk
    lambda e: http1.chunk(e[:10]) + http1.chunk(e[10:]),  # two chunks
    lambda e: b" %x\r\n%s\r\n" % (len(e), e),  # a blank before the size
]


class GeneralRelay(SseRelay):
    """The oracle: every read through the splitter and the per-event bookkeeping, never the shortcut."""

    def steady(self, data: bytes, t: float) -> bool:
        return False


def _relay(first_token: bool, held: bytes = b"", cls: type[SseRelay] = SseRelay) -> SseRelay:
    timing = RequestTiming(0.0)
    if first_token:
        timing.on_output_event(0.5)
    relay = cls(timing, strip=True)
    if held:
        relay.feed(held, 0.6)
    return relay


def _state(relay: SseRelay) -> tuple[object, ...]:
    t = relay.timing
    return (t.first_token_at, t.last_token_at, t.output_events, t.finished, t.answered_at, t.delivered, t.end_at,
            t.usage_tokens, relay.error_event, relay.following)


@pytest.mark.parametrize("first_token", [True, False])
@pytest.mark.parametrize("held", [b"", b"data: {"])
@pytest.mark.parametrize("frame", range(len(FRAMINGS)))
@pytest.mark.parametrize("ev", range(len(EVENTS)))
def test_the_fast_path_takes_a_read_only_where_the_general_path_relays_it_as_it_came(
    ev: int, frame: int, held: bytes, first_token: bool,
) -> None:
    data = FRAMINGS[frame](EVENTS[ev])
    fast_decoder, fast_relay = http1.ChunkedDecoder(), _relay(first_token, held)
    slow_decoder, slow_relay = copy.deepcopy(fast_decoder), _relay(first_token, held, GeneralRelay)
    assert _state(fast_relay) == _state(slow_relay)
    payload = fast_decoder.whole_chunk(data)
    took = payload is not None and fast_relay.steady(payload, 1.0)
    before = slow_decoder.at_boundary
    slow_payload, used = slow_decoder.feed(data)
    out = slow_relay.feed(slow_payload, 1.0) if slow_payload else None
    if took:
        assert payload == slow_payload and used == len(data) and before and slow_decoder.at_boundary
        assert not slow_decoder.done and out is None  # the general path, too, sends the read as it came
        assert _state(fast_relay) == _state(slow_relay)
        assert fast_decoder.at_boundary
    else:
        assert _state(fast_relay) == _state(_relay(first_token, held))  # nothing done: the caller feeds it


def test_the_fast_path_takes_the_steady_token_reads_of_a_stream() -> None:
    decoder, relay = http1.ChunkedDecoder(), _relay(True)
    for i in range(3):
        payload = decoder.whole_chunk(http1.chunk(TOKEN))
        assert payload == TOKEN and relay.steady(payload, 1.0 + i)
    assert (relay.timing.output_events, relay.timing.last_token_at) == (4, 3.0)
    finish = EVENTS[2]
    assert relay.steady(finish, 4.0) and relay.timing.finished and relay.timing.answered_at == 4.0


def test_the_pieces_join_to_the_page_and_all_but_the_last_are_at_least_piece_bytes() -> None:
    m = TapMetrics(CONFIG)
    for i in range(300):
        m.record(f"chat-{i % 40}", "interactive", "ok", Timings(0.1, 0.2, 0.01, 1.0, 10, "engine"), True)
    r = PageRenderer(m)
    page = r.render_now()
    r2 = PageRenderer(m)
    r2.render_now()
    parts = r2._parts(list(m.series.values()), m.in_flight_late())
    got = list(pieces(parts))
    assert len(page) > 3 * PIECE_BYTES and b"".join(got) == page
    assert all(len(p) >= PIECE_BYTES for p in got[:-1]) and len(got) >= 3


def test_an_event_taken_as_quiet_is_one_whose_parse_times_nothing() -> None:
    """relay._quiet lets an event before the first token skip its parse: on every event built from output keys,
    finish_reason, tool_calls, usage and error with empty, null and real values (escapes and blanks included),
    an event it calls quiet is one whose parse finds no output, no finish, no usage and no error; and the role-only
    first event of a chat stream is quiet (the shortcut is taken)."""
    import itertools
    import json

    from exporter.tap.relay import _quiet
    from exporter.tap.timing import carries_output, completion_tokens, has_finish_reason

    values = [b'""', b"null", b'"x"', b"[]", b"{}", b"0", b"false", b'"\\u0078"', b' "" ', b'"" ']
    keys = [b'"content"', b'"text"', b'"reasoning"', b'"finish_reason"', b'"tool_calls"', b'"usage"', b'"error"',
            b'"\\u0063ontent"', b'"role"']
    quiet = 0
    for (k1, v1), (k2, v2) in itertools.product(itertools.product(keys, values), repeat=2):
        for data in (b'{"choices":[{"index":0,"delta":{%s:%s},%s:%s}]}' % (k1, v1, k2, v2),
                     b'{"choices":[{"delta":{%s:%s}}],%s:%s}' % (k1, v1, k2, v2),
                     b'{"choices":[{"text":%s,"x":[%s]}]}' % (v1, k2)):
            try:
                payload = json.loads(data)
            except ValueError:
                continue
            if _quiet(data):
                quiet += 1
                assert not carries_output(payload) and not has_finish_reason(payload), data
                assert completion_tokens(payload) is None and not payload.get("error"), data
    assert quiet > 100
    role = b'{"id":"b","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}'
    assert _quiet(role) and not _quiet(role.replace(b'"content":""', b'"content":"hi"'))
