"""The last complete snapshot, rendered once, and the background loop that replaces it.

/metrics only ever reads `SnapshotHolder.current`, a reference swap away from the newest
complete cycle, so a scrape never waits on an engine, a parse or NVML.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import time
from dataclasses import dataclass

from exporter import exposition, logs
from exporter.collector import Collector, Snapshot
from exporter.targets import TargetSet


@dataclass(frozen=True)
class Published:
    """A snapshot with its exposition bytes, plain and gzipped, computed once per cycle."""

    snapshot: Snapshot
    body: bytes
    gzipped: bytes


def publishable(snapshot: Snapshot) -> Published:
    body = exposition.render(snapshot.samples)
    return Published(snapshot, body, gzip.compress(body, compresslevel=6))


class SnapshotHolder:
    """Holds the newest Published; None until the first cycle completes (then /readyz is 200)."""

    def __init__(self) -> None:
        self.current: Published | None = None

    @property
    def ready(self) -> bool:
        return self.current is not None

    def publish(self, published: Published) -> None:
        self.current = published  # one reference assignment: readers see old or new, never half


class CollectionLoop:
    """Runs a cycle every `interval_s` seconds (start to start) and publishes each result."""

    def __init__(self, collector: Collector, targets: TargetSet, holder: SnapshotHolder, interval_s: float):
        self.collector = collector
        self.targets = targets
        self.holder = holder
        self.interval_s = interval_s

    async def run_once(self) -> Published:
        snapshot = await self.collector.collect(self.targets.current(), self.targets.self_metrics())  # never waits on discovery
        published = await asyncio.to_thread(publishable, snapshot)  # rendering is CPU work
        self.holder.publish(published)
        return published

    async def run_forever(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep serving the previous snapshot; try again next tick
                logs.event("cycle_failed", logging.ERROR, error=type(exc).__name__, detail=str(exc)[:200])
            elapsed = time.monotonic() - started
            if elapsed > self.interval_s:
                logs.event("cycle_overrun", logging.WARNING, duration_s=round(elapsed, 3), interval_s=self.interval_s)
            await asyncio.sleep(max(0.0, self.interval_s - elapsed))
