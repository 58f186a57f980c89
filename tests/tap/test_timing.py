"""The timing state machine, with made-up timestamps, fed SSE events the way the proxy feeds it."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from exporter.tap.relay import SseRelay
from exporter.tap.timing import RequestTiming, carries_output, is_usage_only
from llmslo.conventions import USAGE_SOURCE_CHUNKS, USAGE_SOURCE_ENGINE


def events(t: RequestTiming) -> Callable[[float, object], None]:
    """Feeds one event per call, as one read of the stream, through the relay the proxy uses."""
    relay = SseRelay(t, strip=False)

    def feed(ts: float, payload: object) -> None:
        assert relay.feed(b"data: " + json.dumps(payload).encode() + b"\n\n", ts) is None  # relayed unchanged

    return feed


def chat(**delta: object) -> dict[str, object]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


@pytest.mark.parametrize(
    ("payload", "output"),
    [
        (chat(role="assistant"), False),
        (chat(role="assistant", content=""), False),
        (chat(content=None), False),
        (chat(content="Hi"), True),
        (chat(reasoning_content="think"), True),
        (chat(reasoning="think"), True),
        (chat(tool_calls=[{"index": 0, "function": {"arguments": "{"}}]), True),
        (chat(tool_calls=[]), False),
        ({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, False),
        ({"object": "text_completion", "choices": [{"index": 0, "text": "x"}]}, True),
        ({"object": "text_completion", "choices": [{"index": 0, "text": ""}]}, False),
        ({"choices": [], "usage": {"completion_tokens": 3}}, False),
        ([1, 2], False),
        ({"error": {"message": "boom"}}, False),
    ],
)
def test_what_counts_as_output(payload: object, output: bool) -> None:
    assert carries_output(payload) is output


def test_usage_only_chunk() -> None:
    assert is_usage_only({"choices": [], "usage": {"completion_tokens": 3}})
    assert not is_usage_only({"choices": [{"delta": {"content": "x"}}], "usage": {"completion_tokens": 3}})
    assert not is_usage_only({"choices": []})


def test_stream_with_usage() -> None:
    t = RequestTiming(arrival=10.0)
    t.on_headers(10.01)
    feed = events(t)
    feed(10.02, chat(role="assistant", content=""))  # role-only: not the first token
    feed(10.25, chat(content="a"))
    feed(10.30, chat(content="b"))
    feed(10.45, chat(content="c"))
    feed(10.46, {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    feed(10.47, {"choices": [], "usage": {"completion_tokens": 5}})
    t.on_end(10.5)
    r = t.result()
    assert r.ttfb == pytest.approx(0.01)
    assert r.ttft == pytest.approx(0.25)
    assert r.n_out == 5 and r.usage_source == USAGE_SOURCE_ENGINE
    assert r.tpot == pytest.approx((10.45 - 10.25) / 4)
    assert r.e2e == pytest.approx(0.5)


def test_stream_without_usage_counts_chunks() -> None:
    t = RequestTiming(arrival=0.0)
    feed = events(t)
    for i, ts in enumerate((0.1, 0.2, 0.4)):
        feed(ts, chat(content=f"t{i}"))
    t.on_end(0.5)
    r = t.result()
    assert r.n_out == 3 and r.usage_source == USAGE_SOURCE_CHUNKS
    assert r.tpot == pytest.approx(0.15)


def test_single_token_has_zero_tpot_and_no_token_has_no_ttft() -> None:
    one = RequestTiming(arrival=0.0)
    events(one)(0.3, chat(content="x"))
    assert one.result().tpot == 0.0 and one.result().ttft == pytest.approx(0.3)
    none = RequestTiming(arrival=0.0)
    events(none)(0.3, chat(role="assistant"))
    none.on_end(0.4)
    r = none.result()
    assert r.ttft is None and r.tpot is None and r.n_out == 0 and r.e2e == pytest.approx(0.4)


def test_non_streamed_is_timed_as_e2e_only() -> None:
    t = RequestTiming(arrival=1.0)
    t.on_headers(1.5)
    t.on_usage(40)
    t.on_end(2.0)
    r = t.result(streamed=False)
    assert (r.ttft, r.tpot, r.e2e, r.n_out) == (None, None, pytest.approx(1.0), 40)


