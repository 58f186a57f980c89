"""Incremental Server-Sent Events splitter over raw bytes.

The tap relays bytes and must never change them, so this splitter only *observes*: it
returns each complete event with the exact bytes it was made of (`raw`), so that
concatenating every `raw` plus `pending()` gives back the input, byte for byte. Only the
`data:` field is extracted (what timing needs); other fields and comments stay in `raw`.

Events end at a blank line; lines may end in LF, CRLF or CR (WHATWG SSE). Engines send LF
only, which takes a fast path (one `find` per event); any CR switches the stream to the
general line parser.
"""

from __future__ import annotations

from typing import NamedTuple

DEFAULT_MAX_EVENT_BYTES = 4 * 1024 * 1024


class SseEvent(NamedTuple):
    """One complete event: its exact bytes (terminating blank line included) and its data field.

    A NamedTuple: one is made per streamed chunk, so construction cost matters."""

    raw: bytes
    data: bytes | None  # data lines joined with b"\n"; None when the event has no data field


class EventTooLarge(Exception):
    """An unterminated event grew past the limit: the stream is not SSE the tap can follow."""


def _data_of(block: bytes, sep: bytes) -> bytes | None:
    """The data field of one event block (terminator removed), lines split on `sep`."""
    if block.startswith(b"data:") and sep not in block:  # the common one-line event
        value = block[5:]
        return value[1:] if value[:1] == b" " else value
    parts: list[bytes] | None = None
    for line in block.split(sep):
        if line.startswith(b"data:"):
            value = line[5:]
            if value[:1] == b" ":
                value = value[1:]
            if parts is None:
                parts = [value]
            else:
                parts.append(value)
        elif line == b"data":
            parts = [b""] if parts is None else parts + [b""]
    return None if parts is None else b"\n".join(parts)


class SseSplitter:
    """Feed bytes as they arrive; get back the events they complete.

    Memory is bounded: an event that is still unterminated after `max_event_bytes` raises
    `EventTooLarge` (the caller then stops parsing the stream and relays it blindly).
    """

    __slots__ = ("buf", "_max", "_general")

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self.buf = b""  # pending(), read as an attribute on the per-chunk path
        self._max = max_event_bytes
        self._general = False

    def pending(self) -> bytes:
        """Bytes fed but not yet part of a complete event."""
        return self.buf

    def feed(self, chunk: bytes) -> list[SseEvent]:
        buf = self.buf + chunk if self.buf else chunk
        if not self._general and chunk.find(b"\r") >= 0:  # find: `in` on bytes first tries an int, and formats its error
            self._general = True
        events = self._split_general(buf) if self._general else self._split_lf(buf)
        if len(self.buf) > self._max:
            raise EventTooLarge(f"an SSE event grew past {self._max} bytes without a terminating blank line")
        return events

    def _split_lf(self, buf: bytes) -> list[SseEvent]:
        end = buf.find(b"\n\n")
        if end >= 0 and end == len(buf) - 2:  # the common case: the read is exactly one event
            self.buf = b""
            return [SseEvent(buf, _data_of(buf[:end], b"\n"))]
        events: list[SseEvent] = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            events.append(SseEvent(buf[start : end + 2], _data_of(buf[start:end], b"\n")))
            start = end + 2
        self.buf = buf[start:] if start else buf
        return events

    def _split_general(self, buf: bytes) -> list[SseEvent]:
        """Line-by-line parse accepting LF, CRLF and CR; a blank line ends an event."""
        events: list[SseEvent] = []
        start = 0  # where the current event's raw bytes begin
        pos = 0  # where the next line begins
        lines: list[bytes] = []
        n = len(buf)
        while pos < n:
            lf = buf.find(b"\n", pos)
            cr = buf.find(b"\r", pos)
            if lf < 0 and cr < 0:
                break
            if cr < 0 or (0 <= lf < cr):
                line_end, next_pos = lf, lf + 1
            elif cr == n - 1:
                break  # a CR at the very end may be the first half of CRLF: wait for more bytes
            else:
                line_end = cr
                next_pos = cr + 2 if buf[cr + 1 : cr + 2] == b"\n" else cr + 1
            line = buf[pos:line_end]
            pos = next_pos
            if line:
                lines.append(line)
                continue
            events.append(SseEvent(buf[start:pos], _data_of(b"\n".join(lines), b"\n") if lines else None))
            lines = []
            start = pos
        self.buf = buf[start:]
        return events
