"""The HTTP side: /metrics (cached bytes of the last snapshot), /healthz, /readyz, TLS and auth.

Handlers never compute anything heavy: the exposition was rendered (and gzipped) when the
snapshot was published. Only bcrypt checks run in a thread, and only for credentials not cached
(a client whose credentials worked before is answered on the event loop, however many wrong
passwords are being checked meanwhile): in the fair check queue of `exporter.checkqueue`, which
no flood, from however many addresses, can fill for a client it has never seen.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from dataclasses import dataclass

from aiohttp import web

from exporter import logs
from exporter.checkqueue import FairCheckQueue, Refused
from exporter.config import ConfigError, Listen
from exporter.exposition import CONTENT_TYPE
from exporter.snapshot import SnapshotHolder
from exporter.webconfig import (
    PLAIN_HTTP_OPT_IN,
    Authenticator,
    WebConfig,
    load_certificates,
    load_web_config,
    new_ssl_context,
    peer_sans,
)
from llmslo.problems import describe

PUBLIC_PATHS = ("/healthz", "/readyz")  # probes carry no credentials and reveal nothing
WEB_CONFIG_CHECK_S = 10.0

_LANDING = b"""<html><head><title>llmslo-exporter</title></head><body>
<h1>llmslo-exporter</h1><p><a href="/metrics">/metrics</a> &middot; <a href="/healthz">/healthz</a> &middot;
<a href="/readyz">/readyz</a></p></body></html>
"""


class _TokenBucket:
    """exporter-toolkit's rate_limit: `burst` requests, refilled one per `interval_s`."""

    def __init__(self, interval_s: float, burst: int):
        self.interval_s, self.burst = interval_s, burst
        self.tokens, self.at = float(burst), time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) / self.interval_s)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


@dataclass
class WebState:
    """The active web config; replaced as a whole when the file or its certificates change."""

    web: WebConfig | None
    auth: Authenticator | None
    ssl_context: ssl.SSLContext | None
    bucket: _TokenBucket | None


@dataclass
class WebStateBox:
    """The app's pointer to the active WebState (aiohttp apps are frozen once started; this is not)."""

    current: WebState


WEB_STATE = web.AppKey("web_state", WebStateBox)


BCRYPT_POOL = web.AppKey("bcrypt_pool", FairCheckQueue)


def _state_for(web: WebConfig | None, ssl_context: ssl.SSLContext | None) -> WebState:
    bucket = _TokenBucket(web.rate_limit.interval_s, web.rate_limit.burst) if web and web.rate_limit else None
    return WebState(web, Authenticator(web) if web else None, ssl_context, bucket)


@web.middleware
async def visible_target(request: web.Request, handler):
    """400 for a request target with anything but visible ASCII (RFC 9112 3.2, RFC 3986: the rest is
    percent-encoded). aiohttp's C parser refuses such a target itself; its pure-Python parser, used where the
    C one is not built, lets C1 controls and raw non-ASCII bytes through."""
    if any(not "!" <= char <= "~" for char in request.raw_path):
        return web.Response(status=400, text="Bad Request: only visible ASCII in the request target (percent-encode the rest)\n")
    return await handler(request)


def build_app(holder: SnapshotHolder, state: WebState, bcrypt_pool: FairCheckQueue | None = None) -> web.Application:
    @web.middleware
    async def guard(request: web.Request, handler):
        st = request.app[WEB_STATE].current
        if st.web is not None and request.path not in PUBLIC_PATHS:
            if st.bucket is not None and not st.bucket.take():
                return _with_headers(st, web.Response(status=429, text="Too Many Requests\n"))
            if st.web.tls and st.web.tls.client_allowed_sans:
                sans = peer_sans(request.transport.get_extra_info("peercert") if request.transport else None)
                if not sans & set(st.web.tls.client_allowed_sans):
                    return _with_headers(st, web.Response(status=403, text="client certificate not allowed\n"))
            if st.auth is not None and st.web.auth_required:
                header = request.headers.get("Authorization")
                ok = st.auth.cached(header)
                if ok is None:  # only bcrypt can tell, in its own pool
                    try:
                        ok = await request.app[BCRYPT_POOL].run(
                            st.auth.verify, header, source=request.remote or "", user=st.auth.basic_user(header))
                    except Refused:
                        return _with_headers(st, web.Response(
                            status=429, text="Too Many Requests: credential checks queued\n", headers={"Retry-After": "1"}))
                if not ok:
                    return _with_headers(st, web.Response(
                        status=401, text="Unauthorized\n", headers={"WWW-Authenticate": st.auth.challenge}))
        return _with_headers(st, await handler(request))

    async def metrics(request: web.Request) -> web.Response:
        published = holder.current
        if published is None:
            return web.Response(status=503, text="no collection cycle has completed yet\n")
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            return web.Response(body=published.gzipped, headers={"Content-Type": CONTENT_TYPE, "Content-Encoding": "gzip"})
        return web.Response(body=published.body, headers={"Content-Type": CONTENT_TYPE})

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        if holder.ready:
            return web.Response(text="ready\n")
        return web.Response(status=503, text="first collection cycle not completed\n")

    async def landing(request: web.Request) -> web.Response:
        return web.Response(body=_LANDING, content_type="text/html")

    app = web.Application(middlewares=[visible_target, guard])
    app[WEB_STATE] = WebStateBox(state)
    app[BCRYPT_POOL] = pool = bcrypt_pool or FairCheckQueue()

    async def close_pool(app: web.Application) -> None:
        pool.close()

    app.on_cleanup.append(close_pool)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/", landing)
    return app


def _with_headers(st: WebState, response: web.StreamResponse) -> web.StreamResponse:
    if st.web is not None:
        for name, value in st.web.headers.items():
            response.headers[name] = value
    return response


def _mtimes(web: WebConfig | None) -> tuple:
    if web is None:
        return ()
    out: list[int | None] = []
    for f in web.watched_files():
        try:
            out.append(os.stat(f).st_mtime_ns)
        except OSError:
            out.append(None)
    return tuple(out)


def _load_checked(path: str, active: WebConfig, live_tls: bool) -> WebConfig:
    """The edited web config, validated (certificates included) without touching the live one.

    Blocking file reads: run in a thread so a slow disk never stalls the event loop.
    """
    new = load_web_config(path)
    if (new.tls is None) != (active.tls is None):
        raise ConfigError(describe(path, "turning TLS on or off needs a restart", field="tls_server_config",
                                   fix="restart the exporter"))
    if new.tls and live_tls:
        new_ssl_context(new.tls)  # validate on a scratch context: a failed load can half-change a live one
    return new


async def _watch_web_config(app: web.Application, interval_s: float, seen: tuple) -> None:
    """Reload users, tokens, headers and certificates when their files change (cert rotation).

    Any failure (a broken edit, or something unexpected) is logged and the previous settings stay;
    the watcher itself never stops, or later fixes and certificate rotations would go unseen.
    `seen` is the files' mtimes when the active config was loaded, so an edit made before this
    task first runs is not missed.
    """
    box = app[WEB_STATE]
    while True:
        await asyncio.sleep(interval_s)
        st = box.current
        if st.web is None:
            continue
        try:
            now = await asyncio.to_thread(_mtimes, st.web)
            if now == seen:
                continue
            seen = now
            new = await asyncio.to_thread(_load_checked, st.web.path, st.web, st.ssl_context is not None)
            if new.tls and st.ssl_context is not None:
                # On the loop thread: the live context is shared with the loop's TLS handshakes.
                load_certificates(st.ssl_context, new.tls)
        except Exception as exc:  # CancelledError is not an Exception: stopping still works
            logs.event("web_config_reload_failed", logging.ERROR, error=type(exc).__name__, detail=str(exc)[:300],
                       keeping="previous")
            continue
        box.current = _state_for(new, st.ssl_context)
        logs.event("web_config_reloaded", path=new.path)


@dataclass
class RunningServer:
    runner: web.AppRunner
    port: int
    scheme: str

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_server(
    holder: SnapshotHolder, listen: Listen, web_config_file: str = "", watch_interval_s: float = WEB_CONFIG_CHECK_S
) -> RunningServer:
    """Bind and serve; raises ConfigError for a bad web config and OSError when the port is taken."""
    web_cfg = load_web_config(web_config_file) if web_config_file else None
    ssl_context = new_ssl_context(web_cfg.tls) if web_cfg and web_cfg.tls else None
    app = build_app(holder, _state_for(web_cfg, ssl_context))
    if web_cfg is not None:
        loaded_mtimes = _mtimes(web_cfg)

        async def watcher_ctx(app: web.Application):
            task = asyncio.create_task(_watch_web_config(app, watch_interval_s, loaded_mtimes))
            yield
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        app.cleanup_ctx.append(watcher_ctx)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, listen.host, listen.port, ssl_context=ssl_context)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    port = runner.addresses[0][1] if runner.addresses else listen.port
    scheme = "https" if ssl_context else "http"
    if web_cfg is not None and web_cfg.auth_required and ssl_context is None:
        logs.event("credentials_over_plain_http", logging.WARNING, path=web_cfg.path,
                   detail=f"passwords and tokens cross the network in clear text ({PLAIN_HTTP_OPT_IN}: true)",
                   fix="add tls_server_config")
    logs.event("listening", address=f"{listen.host}:{port}", scheme=scheme,
               auth="on" if web_cfg and web_cfg.auth_required else "off")
    return RunningServer(runner, port, scheme)
