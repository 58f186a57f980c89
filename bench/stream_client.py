"""A keep-alive streaming client for bench.tap_stream_server's chunks, timed in data_received.

bench_tap (TTFT and per-chunk delay by path) and bench_tap_abuse (per-chunk delay by phase) both
run one of these per stream: it sends a request, decodes the chunked SSE reply, hands every
event's `"t"` (the upstream's write time, CLOCK_MONOTONIC ns) to `timed` with the time the data
arrived, and sends the next request on the same connection once the reply has ended, until `stop`.
"""

from __future__ import annotations

import asyncio
import re
import time

_T_RE = re.compile(rb'"t":(\d+)')


class KeepAliveStream(asyncio.Protocol):
    """Subclasses say what to send (`request`) and what to do with each timed event (`timed`)."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.body = b""
        self.in_body = False
        self.left = -1

    def request(self) -> bytes:
        """The next request's bytes (called just before they are written)."""
        raise NotImplementedError

    def timed(self, t: int, now: int) -> None:
        """An event the upstream wrote at `t` arrived at `now` (both time.monotonic_ns())."""
        raise NotImplementedError

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._send()

    def _send(self) -> None:
        assert self.transport is not None
        if self.stop.is_set():
            self.transport.close()
            return
        self.buf, self.body, self.in_body, self.left = b"", b"", False, -1
        self.transport.write(self.request())

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        self.buf += data
        if not self.in_body:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self.buf = self.buf[end + 4 :]
            self.in_body = True
        while True:
            if self.left < 0:
                eol = self.buf.find(b"\r\n")
                if eol < 0:
                    return
                size = int(self.buf[:eol], 16)
                if size == 0:
                    self._send()
                    return
                self.buf = self.buf[eol + 2 :]
                self.left = size
            if len(self.buf) < self.left + 2:
                return
            self.body += self.buf[: self.left]
            self.buf = self.buf[self.left + 2 :]
            self.left = -1
            *events, self.body = self.body.split(b"\n\n")
            for event in events:
                m = _T_RE.search(event)
                if m is not None:
                    self.timed(int(m.group(1)), now)
