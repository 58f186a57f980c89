"""Keep-alive connections from the tap to its one upstream engine.

Each connection is a bare asyncio protocol that hands what it receives to the exchange
currently using it (exporter.tap.exchange.Exchange); between exchanges it waits in the pool.
Reading from it is paused and resumed through the same flow control as a client's
(exporter.tap.flow): while the client it relays to is not reading, and never resumed unless paused.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Protocol
from urllib.parse import urlsplit

from exporter.tap.flow import FlowControl

# Engines behind the tap are mostly uvicorn (vLLM, SGLang) or axum (TGI). Uvicorn closes a
# keep-alive connection after 5 s idle; reusing one just as it does fails the request, so the
# pool lets connections go before that.
IDLE_TIMEOUT_S = 4.0
MAX_IDLE = 1024


class UpstreamUser(Protocol):
    """What an upstream connection reports to the exchange using it."""

    def upstream_data(self, data: bytes) -> None: ...

    def upstream_lost(self) -> None: ...

    def upstream_full(self, full: bool) -> None: ...


class UpstreamConnection(asyncio.Protocol):
    __slots__ = ("pool", "transport", "flow", "user", "idle_since", "closed")

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.flow: FlowControl  # set once connected
        self.user: UpstreamUser | None = None
        self.idle_since = 0.0
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.flow = FlowControl(transport)  # type: ignore[arg-type]
        self.pool.live.add(self)

    def data_received(self, data: bytes) -> None:
        user = self.user
        if user is not None:
            user.upstream_data(data)
        elif self.transport is not None:
            self.transport.close()  # bytes nobody asked for: the connection is out of step

    def eof_received(self) -> bool:
        return False  # close; connection_lost tells the user

    def pause_writing(self) -> None:
        self.flow.write_paused = True
        if self.user is not None:
            self.user.upstream_full(True)

    def resume_writing(self) -> None:
        self.flow.write_paused = False
        if self.user is not None:
            self.user.upstream_full(False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        user, self.user = self.user, None
        if user is not None:
            user.upstream_lost()

    def usable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()


class UpstreamPool:
    """Connections to one upstream base URL (http or https), reused most-recent first."""

    def __init__(self, base_url: str, connect_timeout_s: float, ca_file: str = "") -> None:
        """`ca_file`: PEM certificates to trust for an https:// upstream (default: the system's)."""
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{base_url!r} is not an http:// or https:// URL")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context(cafile=ca_file or None) if parts.scheme == "https" else None
        )
        self.host_field = parts.netloc.rsplit("@", 1)[-1].encode("idna")
        self.path_prefix = parts.path.rstrip("/").encode()
        self.connect_timeout_s = connect_timeout_s
        self.live: set[UpstreamConnection] = set()
        self._idle: list[UpstreamConnection] = []

    def take_idle(self) -> UpstreamConnection | None:
        """The most recently released usable connection, or None (then `connect`)."""
        idle = self._idle
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.usable() and now - conn.idle_since < IDLE_TIMEOUT_S:
                return conn
            if conn.transport is not None:
                conn.transport.close()
        return None

    async def connect(self) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(
                lambda: UpstreamConnection(self), self.host, self.port, ssl=self.ssl,
                server_hostname=self.host if self.ssl else None,
            ),
            self.connect_timeout_s,
        )
        return conn

    def release(self, conn: UpstreamConnection, reusable: bool) -> None:
        conn.user = None
        if reusable and conn.usable() and len(self._idle) < MAX_IDLE:
            conn.flow.resume_reading()  # it may have been paused for a slow client
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        elif conn.transport is not None:
            conn.transport.abort() if not reusable else conn.transport.close()

    def forget(self, conn: UpstreamConnection) -> None:
        """A connection closed (by either side): it is neither live nor waiting any more."""
        self.live.discard(conn)
        if conn.user is None and conn in self._idle:  # an idle one the engine closed
            self._idle.remove(conn)

    def close_expired(self) -> int:
        """Close idle connections past IDLE_TIMEOUT_S, before the engine does; returns how many.
        Reuse is most-recent first, so after a burst the least recent ones would otherwise wait."""
        cutoff = time.monotonic() - IDLE_TIMEOUT_S
        expired = [c for c in self._idle if c.idle_since < cutoff]
        for conn in expired:
            self._idle.remove(conn)
            if conn.transport is not None:
                conn.transport.close()
        return len(expired)

    def close(self) -> None:
        self._idle.clear()
        for conn in list(self.live):
            if conn.transport is not None:
                conn.transport.abort()
