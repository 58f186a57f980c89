"""The SSE splitter returns every byte it was fed, however the stream is cut, and finds the data fields."""

from __future__ import annotations

import random

import pytest

from exporter.tap.sse import EventTooLarge, SseSplitter

STREAM_LF = (
    b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
    b": keep-alive comment\n\n"
    b'event: message\nid: 7\ndata: {"choices":[{"delta":{"content":"Hi"}}]}\n\n'
    b"data: line one\ndata: line two\n\n"
    b"data:no-space\n\n"
    b"data\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED_DATA = [
    b'{"choices":[{"delta":{"role":"assistant","content":""}}]}',
    None,
    b'{"choices":[{"delta":{"content":"Hi"}}]}',
    b"line one\nline two",
    b"no-space",
    b"",
    b"[DONE]",
]


def split_all(stream: bytes, cuts: list[int]) -> tuple[list[bytes], list[bytes | None], bytes]:
    s = SseSplitter()
    raws: list[bytes] = []
    datas: list[bytes | None] = []
    prev = 0
    for cut in [*cuts, len(stream)]:
        for ev in s.feed(stream[prev:cut]):
            raws.append(ev.raw)
            datas.append(ev.data)
        prev = cut
    return raws, datas, s.pending()


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_every_cut_gives_back_the_same_bytes_and_events(newline: bytes) -> None:
    stream = STREAM_LF.replace(b"\n", newline) + b"data: partial"
    rng = random.Random(1)
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(0, 40)))
        raws, datas, tail = split_all(stream, cuts)
        assert b"".join(raws) + tail == stream
        assert datas == EXPECTED_DATA
        assert tail == b"data: partial"


def test_byte_by_byte_crlf_split_between_cr_and_lf() -> None:
    stream = b"data: a\r\n\r\ndata: b\r\n\r\n"
    raws, datas, tail = split_all(stream, list(range(1, len(stream))))
    assert datas == [b"a", b"b"] and tail == b""
    assert raws == [b"data: a\r\n\r\n", b"data: b\r\n\r\n"]


def test_lf_stream_switches_to_general_parser_when_a_cr_appears() -> None:
    s = SseSplitter()
    assert [e.data for e in s.feed(b"data: a\n\ndata: b")] == [b"a"]
    assert [e.data for e in s.feed(b"\r\n\r\n")] == [b"b"]


def test_unterminated_event_past_the_limit_raises() -> None:
    s = SseSplitter(max_event_bytes=100)
    s.feed(b"data: " + b"x" * 90)
    with pytest.raises(EventTooLarge):
        s.feed(b"x" * 20)


def test_complete_events_larger_than_the_limit_are_fine() -> None:
    s = SseSplitter(max_event_bytes=100)
    events = s.feed(b"data: " + b"x" * 500 + b"\n\n")
    assert len(events) == 1 and events[0].data == b"x" * 500 and s.pending() == b""
