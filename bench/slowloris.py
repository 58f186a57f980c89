"""Slowloris against the tap, and what its legitimate clients read: shared by bench_tap_abuse and
tests/tap/test_abuse_scale.py.

A Fleet holds trickling connections: each sends a request head that never ends one byte at a
time, a random gap apart, records the first answer it gets, and is opened again (same slot)
whenever the tap closes it.
"""

from __future__ import annotations

import asyncio
import collections
import random
import re
import urllib.request
from dataclasses import dataclass, field


class Trickle(asyncio.Protocol):
    def __init__(self, fleet: Fleet, slot: int) -> None:
        self.fleet, self.slot = fleet, slot
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.pos = 0
        self.answered = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.fleet.live.add(self)
        self._next()

    def _next(self) -> None:
        self.timer = asyncio.get_running_loop().call_later(self.fleet.rng.uniform(*self.fleet.gap_s), self._tick)

    def _tick(self) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        t.write(self.fleet.head[self.pos : self.pos + 1])
        self.pos += 1
        self.fleet.bytes_sent += 1
        self._next()

    def data_received(self, data: bytes) -> None:
        if not self.answered:
            self.answered = True
            status = data[9:12].decode(errors="replace")
            self.fleet.answers[status] += 1
            self.fleet.bytes_before_answer.append(self.pos)
            if status == "408":
                self.fleet.slots_answered.add(self.slot)

    def eof_received(self) -> bool:
        return False  # close our side too, as a client does

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.fleet.live.discard(self)
        self.fleet.closed += 1
        self.fleet.reopen(self.slot)


@dataclass
class Fleet:
    """Trickling connections to `port`, each sending `head` (which must never end) a byte every `gap_s`
    (a range; drawn from `rng`); a closed one is opened again after `reopen_s`, a failed connect
    retried after `retry_s`."""

    port: int
    head: bytes
    gap_s: tuple[float, float]
    rng: random.Random
    reopen_s: float = 0.0
    retry_s: float = 0.1
    live: set[Trickle] = field(default_factory=set)
    running: bool = True
    opened: int = 0
    closed: int = 0
    connect_errors: int = 0
    bytes_sent: int = 0
    answers: collections.Counter[str] = field(default_factory=collections.Counter)
    bytes_before_answer: list[int] = field(default_factory=list)
    slots_answered: set[int] = field(default_factory=set)  # the slots that were answered 408 at least once
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def open(self, slot: int) -> None:
        loop = asyncio.get_running_loop()
        while self.running:
            try:
                await loop.create_connection(lambda: Trickle(self, slot), "127.0.0.1", self.port)
                self.opened += 1
                return
            except OSError:
                self.connect_errors += 1
                await asyncio.sleep(self.retry_s)

    def reopen(self, slot: int) -> None:
        if self.running:
            task = asyncio.get_running_loop().create_task(self._reopen(slot))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _reopen(self, slot: int) -> None:
        if self.reopen_s:
            await asyncio.sleep(self.reopen_s)
        await self.open(slot)

    def stop(self) -> None:
        self.running = False
        for t in list(self.live):
            if t.transport is not None:
                t.transport.abort()
        for task in self.tasks:
            task.cancel()


async def read_chunked(reader: asyncio.StreamReader) -> bytes:
    """A chunked body (its trailer section empty), decoded."""
    body = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers from the upstreams used here
            return bytes(body)
        body += (await reader.readexactly(size + 2))[:-2]


def refusals(metrics_url: str) -> dict[str, float]:
    """llm_tap_refusals_total by reason, from the tap's /metrics ({} when it has none: a tap before the abuse limits)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'^llm_tap_refusals_total\{reason="([^"]+)"\} (\S+)$', text, re.M)}
