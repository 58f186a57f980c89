"""The list of targets for a cycle: static ones from flags/config plus Kubernetes-discovered ones.

Discovery refreshes on its own, slower interval (listing pods every 5 s on every node would load
the API server for nothing); when a refresh fails the last good list stays in use.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from exporter import logs
from exporter.config import TargetConfig


class Discoverer(Protocol):
    async def discover(self) -> list[TargetConfig]: ...


class TargetSet:
    def __init__(self, static: tuple[TargetConfig, ...], discoverer: Discoverer | None = None, refresh_s: float = 30.0):
        self.static = static
        self.discoverer = discoverer
        self.refresh_s = refresh_s
        self._discovered: list[TargetConfig] = []
        self._refreshed_at: float | None = None

    async def current(self) -> list[TargetConfig]:
        if self.discoverer is not None and (
            self._refreshed_at is None or time.monotonic() - self._refreshed_at >= self.refresh_s
        ):
            self._refreshed_at = time.monotonic()
            try:
                found = await self.discoverer.discover()
            except Exception as exc:
                logs.event("discovery_failed", logging.WARNING, error=type(exc).__name__, detail=str(exc)[:200],
                           keeping=len(self._discovered))
            else:
                if [t.label for t in found] != [t.label for t in self._discovered]:
                    logs.event("discovery_changed", targets=len(found))
                self._discovered = found
        static_labels = {t.label for t in self.static}
        return list(self.static) + [t for t in self._discovered if t.label not in static_labels]
