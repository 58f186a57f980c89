"""Where the engine reads the time: the wall clock when serving, a settable clock in virtual mode."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...


class RealClock:
    """Monotonic seconds; only differences are used, so the origin does not matter."""

    def now(self) -> float:
        return time.monotonic()


class VirtualClock:
    """Simulated seconds that move only when the virtual driver moves them, so a run never sleeps."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        self._t += seconds

    def set(self, t: float) -> None:
        if t < self._t:
            raise ValueError(f"virtual clock cannot go back from {self._t} to {t}")
        self._t = t
