"""Flow control of one connection, client or upstream, in one place (as uvicorn's `FlowControl`).

Reading from a client is paused for three reasons: pipelined bytes pile up while a response is
relayed, a chunked request body is decoded a slice per turn of the loop, and a tunnel's upstream is
full. Reading from an upstream is paused while the client it relays to is not reading. Writing is
paused by the transport itself when its buffer fills (`write_paused`; a full client makes the
exchange stop reading from the upstream). The flags say what was asked of the transport, so that a
resume is only ever sent after a pause.
"""

from __future__ import annotations

import asyncio


class FlowControl:
    __slots__ = ("transport", "read_paused", "write_paused")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.read_paused = False  # the tap stopped reading from the peer
        self.write_paused = False  # the peer's socket buffer is full (asyncio.Protocol.pause_writing)

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            if not self.transport.is_closing():
                self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            if not self.transport.is_closing():
                self.transport.resume_reading()
