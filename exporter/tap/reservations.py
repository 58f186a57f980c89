"""Admitted requests the engine does not show yet: each holds a start seat at the gate until a reading shows it.

A request the gate admits reaches the engine's page some time later (the relay, the engine's tokenizer, its
next step, the next poll). A reading taken meanwhile shows the KV without it, so the gate must keep counting it:
resetting the count at every reading let a burst through twice over (issue 34: 29 of a 60-request burst admitted
at 9.5 seats, 19 of them late). Each admission is a reservation, retired oldest first as the engine shows new
requests (its running, finished and persisted-queue counts grew past their highest; shared by `taps` taps), or
as the request ends at the tap (it holds no KV then; it stays only to absorb the engine's count of it), or after
`lifetime_s` (a request lost on the way must not hold a seat for ever). Only reservations made before the
reading's page was asked for can be in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class _Held:
    admitted_at: float
    settled: bool = False  # ended at the tap: it holds nothing, but the engine may still count it as new


@dataclass
class Reservations:
    """The gate's outstanding admissions (module docstring); every entry is at most `lifetime_s` old."""

    lifetime_s: float
    _held: dict[int, _Held] = field(default_factory=dict)  # ticket -> reservation, oldest first
    _next: int = 1
    _mark: float | None = None  # the highest engine count of requests seen (running + finished + queued)
    _credit: float = 0.0  # new engine requests not yet matched to a reservation (a share of one, with taps)
    _open: int = 0  # reservations not settled

    def add(self, now: float) -> int:
        """A new admission; its ticket, for `settle`."""
        self._expire(now)
        ticket, self._next = self._next, self._next + 1
        self._held[ticket] = _Held(now)
        self._open += 1
        return ticket

    def settle(self, ticket: int) -> None:
        """The request ended at the tap (answered, failed or abandoned): it no longer holds a seat."""
        held = self._held.get(ticket)
        if held is not None and not held.settled:
            held.settled = True
            self._open -= 1

    def count(self, now: float) -> int:
        """Admissions that still hold a start seat."""
        self._expire(now)
        return self._open

    def seen(self, engine_count: float, asked_at: float, now: float, taps: int = 1, restarted: bool = False) -> None:
        """A reading, whose page was asked for at `asked_at`, counts `engine_count` requests (running + finished +
        persisted queue): what grew past the highest count so far retires as many reservations (this tap's share
        of them: 1 / taps), oldest first. `restarted`: the engine's counters went back, so the count starts anew."""
        self._expire(now)
        if not math.isfinite(engine_count):
            return
        if self._mark is None or restarted:
            self._mark = engine_count
            return
        if engine_count > self._mark:
            self._credit += (engine_count - self._mark) / max(1, taps)
            self._mark = engine_count
        for ticket, held in list(self._held.items()):
            if self._credit < 1 or held.admitted_at > asked_at:
                break
            self._drop(ticket)
            self._credit -= 1
        self._credit %= 1  # new engine requests beyond this tap's eligible ones are someone else's

    def _expire(self, now: float) -> None:
        while self._held:
            ticket, held = next(iter(self._held.items()))
            if now - held.admitted_at <= self.lifetime_s:
                return
            self._drop(ticket)

    def _drop(self, ticket: int) -> None:
        if not self._held.pop(ticket).settled:
            self._open -= 1

    def __len__(self) -> int:
        return len(self._held)
