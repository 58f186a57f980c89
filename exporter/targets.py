"""The list of targets for a cycle: static ones from flags/config plus Kubernetes-discovered ones.

Discovery refreshes in its own background task, on its own slower interval (listing pods every
5 s on every node would load the API server for nothing), and swaps the new list in when done.
A cycle only reads the last list: a slow or hung API server never delays a snapshot. When a
refresh fails the last good list stays in use.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from exporter import logs
from exporter.config import TargetConfig
from exporter.model import NormSample

MIN_REFRESH_S = 1.0  # a zero or tiny refresh_interval must not turn the task into a busy loop


class Discoverer(Protocol):
    async def discover(self) -> list[TargetConfig]: ...

    def self_metrics(self) -> list[NormSample]: ...


class TargetSet:
    """Static targets plus the last discovered list; `start()` runs the refresh task, `stop()` ends it."""

    def __init__(self, static: tuple[TargetConfig, ...], discoverer: Discoverer | None = None, refresh_s: float = 30.0):
        self.static = static
        self.discoverer = discoverer
        self.refresh_s = refresh_s
        self._discovered: list[TargetConfig] = []
        self._current: list[TargetConfig] = list(static)
        self._task: asyncio.Task | None = None

    def current(self) -> list[TargetConfig]:
        """The targets for this cycle: no I/O, whatever the last refresh swapped in."""
        return list(self._current)

    def self_metrics(self) -> list[NormSample]:
        """The discoverer's own counters for the snapshot; none without discovery."""
        return self.discoverer.self_metrics() if self.discoverer is not None else []

    async def refresh(self) -> None:
        """Ask the discoverer once and swap the result in; on failure keep the last good list."""
        if self.discoverer is None:
            return
        started = time.monotonic()
        try:
            found = await self.discoverer.discover()
        except Exception as exc:
            logs.event("discovery_failed", logging.WARNING, error=type(exc).__name__,
                       reason=getattr(exc, "reason", "error"), detail=str(exc)[:200],
                       duration_s=round(time.monotonic() - started, 3), keeping=len(self._discovered))
            return
        duration = round(time.monotonic() - started, 3)
        if [t.label for t in found] != [t.label for t in self._discovered]:
            logs.event("discovery_changed", targets=len(found), duration_s=duration)
        else:
            logs.event("discovery_refreshed", logging.DEBUG, targets=len(found), duration_s=duration)
        self._discovered = found
        static_labels = {t.label for t in self.static}
        self._current = list(self.static) + [t for t in found if t.label not in static_labels]

    async def start(self) -> None:
        """Start refreshing in the background (the first refresh right away); no-op without discovery."""
        if self.discoverer is not None and self._task is None:
            self._task = asyncio.create_task(self._refresh_forever(), name="llmslo-discovery")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _refresh_forever(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(max(self.refresh_s, MIN_REFRESH_S))
