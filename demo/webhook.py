"""The on-call end of the demo: an Alertmanager webhook receiver that records every notification.

Runs inside the demo (or test) process on a loopback port. Each notification is kept in memory with the
time it arrived and appended to a JSON-lines file, so the demo can show what paged whom and when, and the
integration test can assert on exactly what Alertmanager delivered.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web


@dataclass(frozen=True)
class Notification:
    """One webhook POST: the route it came in on (`page`, `ticket`) and Alertmanager's payload."""

    received_at: float  # time.time()
    route: str
    payload: dict

    @property
    def alerts(self) -> list[dict]:
        return list(self.payload.get("alerts") or [])


@dataclass
class WebhookReceiver:
    """POST /<route> records a notification; start() binds a free loopback port."""

    log_path: Path
    host: str = "127.0.0.1"
    notifications: list[Notification] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _receive(self, request: web.Request) -> web.Response:
        try:
            payload = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.Response(status=400, text="expected Alertmanager's JSON webhook payload")
        note = Notification(time.time(), request.match_info["route"], payload)
        self.notifications.append(note)
        line = json.dumps({"received_at": note.received_at, "route": note.route, "payload": payload}, sort_keys=True)
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        self._changed.set()
        return web.Response(text="ok")

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text("")
        app = web.Application()
        app.router.add_post("/{route}", self._receive)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def alert_events(self) -> list[tuple[float, str, dict]]:
        """(received_at, route, alert) for every alert in every notification, in arrival order."""
        return [(n.received_at, n.route, a) for n in self.notifications for a in n.alerts]

    async def wait_for(self, predicate, timeout_s: float) -> tuple[float, str, dict] | None:
        """The first alert event satisfying predicate(route, alert), waiting up to timeout_s for one."""
        deadline = time.monotonic() + timeout_s
        while True:
            for event in self.alert_events():
                if predicate(event[1], event[2]):
                    return event
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(left, 1.0))
            except asyncio.TimeoutError:
                pass
