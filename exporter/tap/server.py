"""Runs the tap: the proxy on one port, its own /metrics on another.

The metrics get their own port so that the engine's /metrics behind the tap stays reachable
through the proxy port unchanged. Usable in-process (tests, benchmarks) or from the CLI.
The proxy listens on a bare asyncio server (exporter.tap.proxy); the metrics endpoint is a
small aiohttp app on the same event loop, whose page is rendered in slices between relayed
chunks (exporter.tap.exposition). The server also keeps the upstream's model list fresh
(exporter.tap.models), which decides the values of the `model` label.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from exporter.tap.admission import Admission
from exporter.tap.classes import SloConfig
from exporter.tap.exposition import CONTENT_TYPE, PageRenderer, pieces
from exporter.tap.metrics import TapMetrics
from exporter.tap.models import DEFAULT_REFRESH_S, ModelNames, ServedModels
from exporter.tap.policy import Observer
from exporter.tap.proxy import TapProxy
from exporter.tap.reload import DEFAULT_INTERVAL_S, SloReloader
from exporter.tap.settings import TapSettings


@dataclass(frozen=True)
class BoundAddress:
    host: str
    port: int

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def _bound(runner: web.AppRunner) -> BoundAddress:
    addr = runner.addresses[0]
    return BoundAddress(str(addr[0]), int(addr[1]))


class TapServer:
    """The proxy and metrics listeners, started and stopped together."""

    def __init__(
        self,
        settings: TapSettings,
        slo: SloConfig,
        observer: Observer | None = None,
        shutdown_timeout_s: float = 10.0,
        models_refresh_s: float = DEFAULT_REFRESH_S,
        admission: Admission | None = None,
        slo_paths: Sequence[str | Path] = (),
        reload_interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        """`models_refresh_s`: how often the upstream's GET /v1/models is read (0: never; then only
        the classes' model globs admit model names as label values). `admission`: the KV admission
        gate (exporter.tap.admission), polled while the server runs; None: every request is admitted.
        `slo_paths`: the SLO files `slo` was read from, reloaded when they change (exporter.tap.reload;
        every `reload_interval_s`, 0: only on reload_slo())."""
        self.served = ServedModels(settings.upstream, settings.upstream_ca, models_refresh_s)
        self.metrics = TapMetrics(slo, names=ModelNames(slo, self.served), genai=settings.genai_names)
        self.renderer = PageRenderer(self.metrics)
        self.proxy = TapProxy(settings, slo, self.metrics, observer)
        self.admission = admission
        self.proxy.admission = admission
        if admission is not None:
            self.renderer.extra = admission.render
            admission.in_flight = self.proxy.in_flight  # the seat estimate's running requests (exporter.tap.seats)
        self.shutdown_timeout_s = shutdown_timeout_s
        self.reloader = SloReloader(slo_paths, lambda: self.proxy.slo, self.apply_slo, self.proxy.check_deadlines_fit,
                                    self._reload_failed, reload_interval_s)
        self._runners: list[web.AppRunner] = []
        self._proxy_server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.proxy_address: BoundAddress | None = None
        self.metrics_address: BoundAddress | None = None

    def apply_slo(self, slo: SloConfig) -> list[str]:
        """Run on `slo` from now on (a reload): new requests get its objectives, in-flight ones keep theirs;
        returns the histogram families that started again with new bucket edges."""
        self.proxy.set_slo(slo)
        return self.metrics.set_slo(slo)

    def _reload_failed(self) -> None:
        self.metrics.config_reload_failures += 1

    def reload_slo(self) -> None:
        """Check the SLO files now (SIGHUP)."""
        self.reloader.request()

    def _metrics_app(self) -> web.Application:
        renderer = self.renderer

        async def metrics(request: web.Request) -> web.StreamResponse:
            # Written a piece at a time: a megabyte in one write is one long copy through the
            # kernel (on loopback, into the reader's socket too) while no chunk moves.
            parts = await renderer.render_parts()
            response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
            response.content_length = sum(map(len, parts))
            await response.prepare(request)
            for piece in pieces(parts):  # joined one at a time, a turn of the loop apart
                await response.write(piece)
                await asyncio.sleep(0)
            await response.write_eof()
            return response

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        return app

    async def _start_app(self, app: web.Application, where: tuple[str, int] | str) -> BoundAddress | None:
        """Serve `app` on HOST:PORT, or on a unix socket path (then there is no address to report)."""
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=self.shutdown_timeout_s)
        await runner.setup()
        self._runners.append(runner)
        if isinstance(where, str):
            await web.UnixSite(runner, where).start()
            return None
        await web.TCPSite(runner, where[0], where[1], reuse_address=True).start()
        return _bound(runner)

    async def start(
        self, listen: tuple[str, int], metrics_listen: tuple[str, int] | str, reuse_port: bool = False
    ) -> None:
        """Bind both ports (port 0 = any free port; see proxy_address / metrics_address). The metrics
        may go to a unix socket path instead; `reuse_port` lets several worker processes share the
        proxy port (SO_REUSEPORT: the kernel spreads connections over them)."""
        try:
            loop = asyncio.get_running_loop()
            self._proxy_server = await loop.create_server(
                self.proxy.protocol, listen[0], listen[1], reuse_address=True, reuse_port=reuse_port or None,
                backlog=1024,
            )
            self.proxy.start()
            self._sweeper = loop.create_task(self._sweep())
            addr = self._proxy_server.sockets[0].getsockname()
            self.proxy_address = BoundAddress(str(addr[0]), int(addr[1]))
            self.metrics_address = await self._start_app(self._metrics_app(), metrics_listen)
            await self.served.start()
            self.reloader.start()
            if self.admission is not None:
                self.admission.start()
        except BaseException:
            await self.stop()
            raise

    async def _sweep(self) -> None:
        """Idle clients and expired upstream connections, closed every few seconds."""
        period = min(2.0, self.proxy.settings.client_idle_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            self.proxy.close_idle()
            self.proxy.pool.close_expired()

    async def stop(self) -> None:
        """Stop listening, let in-flight requests finish (up to shutdown_timeout_s), close everything."""
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
        await self.reloader.stop()
        await self.served.stop()
        if self.admission is not None:
            await self.admission.stop()
        server, self._proxy_server = self._proxy_server, None
        if server is not None:
            server.close()
            await self.proxy.drain(self.shutdown_timeout_s)
        runners, self._runners = self._runners, []
        for runner in reversed(runners):
            await runner.cleanup()
