"""One collection cycle on the event loop: every target and the GPUs at once, then self-metrics, into a Snapshot.

Each target is fetched with its own deadline and byte cap, then parsed, adapted and checked in a worker
thread (exporter/cycle.py says how: so a flooded page never stalls the event loop that answers /metrics); any
failure marks that target down with a reason and touches nothing else. NVML runs in a daemon thread of its own
(kept between cycles), so a hung driver call can neither block the event loop nor keep the process from exiting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from exporter import logs
from exporter.config import ExporterConfig, TargetConfig
from exporter.cycle import PageCycle, Parsed, ScrapeResult, Snapshot, TargetState, TargetStatus, complete_page
from exporter.daemon_worker import DaemonWorker
from exporter.guard import CardinalityGuard
from exporter.model import NormSample
from exporter.sources import is_file_url
from exporter.sources.fetch import fetch_page
from exporter.sources.file import FileReader
from llmslo import conventions as c

if TYPE_CHECKING:  # aiohttp costs about 0.1 s to import: only runs with an http(s) target pay it
    import aiohttp

__all__ = ["Collector", "Snapshot", "TargetStatus"]


# NVML is one library per process, so one thread reads it for every collector in the process: never
# more than one, even with a call hung (a second collector's call would wait behind it, as it would
# inside NVML). It ends after a minute without work (longer than any usual interval, so a running
# exporter keeps it).
_GPU_WORKER = DaemonWorker("llmslo-gpu", idle_s=60.0)


class Collector(PageCycle):
    """Runs cycles on the event loop; keeps only small per-target state (detected kind, counters) between them."""

    def __init__(
        self,
        config: ExporterConfig,
        session: aiohttp.ClientSession | None,
        gpu_provider: Any | None,
        node_name: str,
        guard: CardinalityGuard | None = None,
    ):
        super().__init__(config, node_name, guard)
        self.session = session  # None: opened (and owned, see `close`) when an http(s) target is first scraped
        self._owns_session = False
        self.gpu_provider = gpu_provider
        self._gpu_future: asyncio.Future | None = None
        self._files = FileReader()  # file:// targets: one read in flight per target, even when one hangs
        self._last_gpu_up: list[NormSample] = []
        if gpu_provider is not None:  # the pool is said beside the GPU series it is joined to, never without them
            self.node_pool = config.node_pool
        if gpu_provider is not None and config.pod_resources_url:
            from exporter.gpu.podmap import PodMapClient
            from exporter.gpu.podresources import PodMapper

            client = PodMapClient(config.pod_resources_url, node_name, config.pod_resources_timeout_s)
            self.pod_mapper = PodMapper(client)
        elif gpu_provider is not None and config.pod_resources_socket != "off":
            from exporter.gpu.podresources import PodMapper, PodResourcesClient

            self.pod_mapper = PodMapper(PodResourcesClient(config.pod_resources_socket, config.pod_resources_timeout_s))

    # ---------------------------------------------------------------- cycle
    async def collect(self, targets: Sequence[TargetConfig], extra: Sequence[NormSample] = ()) -> Snapshot:
        """One cycle; `extra` are samples made elsewhere (discovery's counters) added to the self-metrics."""
        started = time.perf_counter()
        self._files.forget(self._forget(targets))
        *scrapes, gpu_samples = await asyncio.gather(
            *(self._scrape(t) for t in targets), self._collect_gpus()
        )
        return self._snapshot(started, scrapes, gpu_samples, extra)

    # ---------------------------------------------------------------- targets
    async def _scrape(self, target: TargetConfig) -> ScrapeResult:
        state = self._states.setdefault(target.label, TargetState())
        started = time.perf_counter()
        result: Parsed | Exception
        try:
            body = await fetch_page(
                None if is_file_url(target.url) else self._http_session(),
                target.url,
                timeout_s=self.config.target_timeout(target),
                max_bytes=self.config.target_max_bytes(target),
                files=self._files,
                key=target.label,
            )
            pending = [complete_page(body)]  # the worker thread takes the only reference: freed once read
            del body
            result = await asyncio.to_thread(self._parse_and_adapt, target, pending, state)
        except Exception as exc:  # a FetchError, or an adapter's bug (only its own target goes down)
            result = exc
        return self._scraped(target, state, result, time.perf_counter() - started)

    def _http_session(self) -> aiohttp.ClientSession:
        if self.session is None:
            from exporter.sources.http import new_session

            self.session = new_session()
            self._owns_session = True
        return self.session

    async def close(self) -> None:
        """Close the client session this collector opened (one passed in is the caller's to close)."""
        if self._owns_session and self.session is not None:
            await self.session.close()
            self.session = None
            self._owns_session = False
        if self.pod_mapper is not None:
            self.pod_mapper.close()

    # ---------------------------------------------------------------- GPUs
    async def _collect_gpus(self) -> list[NormSample]:
        if self.gpu_provider is None:
            return []
        from exporter.gpu import collect_gpus

        if self._gpu_future is not None and not self._gpu_future.done():
            logs.event("gpu_collection_hung", logging.WARNING, note="previous NVML call has not returned")
            return self._gpus_down()
        owners = await self._gpu_owners()
        future = _GPU_WORKER.submit(collect_gpus, self.gpu_provider, self.node_name, owners)
        self._gpu_future = future
        try:
            samples = await asyncio.wait_for(asyncio.shield(future), self.config.gpu_timeout_s)
        except TimeoutError:
            logs.event("gpu_collection_timeout", logging.WARNING, timeout_s=self.config.gpu_timeout_s)
            return self._gpus_down()
        except Exception as exc:  # collect_gpus promises not to raise; be safe anyway
            logs.event("gpu_collection_failed", logging.ERROR, error=type(exc).__name__)
            return self._gpus_down()
        self._last_gpu_up = [s for s in samples if s.metric.name == c.GPU_UP.name]
        return list(samples)

    async def _gpu_owners(self) -> dict | None:
        """Device ID -> owning container, listed from the kubelet this cycle (bounded by its deadline);
        None when the mapping is off or the node has no GPUs to map."""
        if self.pod_mapper is None or not self.gpu_provider.devices():
            return None
        return await asyncio.to_thread(self.pod_mapper.refresh)

    def _gpus_down(self) -> list[NormSample]:
        """`llm_gpu_up 0` for the GPUs we last saw, so a hung driver shows up as GPUs down."""
        return [NormSample(s.metric, dict(s.labels), 0.0, s.suffix) for s in self._last_gpu_up]
