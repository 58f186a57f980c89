"""The on-call end of the demo: an Alertmanager webhook receiver that records every notification.

Runs inside the demo (or test) process on a loopback port. Each notification (one POST: a group's firing
or resolved alerts) is kept in memory with the time it arrived and appended to a JSON-lines file, so the
demo can show what paged whom and when, and the integration tests can assert on exactly what Alertmanager
delivered, and how often.
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

    @property
    def status(self) -> str:
        """`firing` while any alert of the group fires, `resolved` for the group's all-clear."""
        return str(self.payload.get("status", ""))

    @property
    def group_key(self) -> str:
        """Alertmanager's identity of the group (route and group_by values): one incident's notifications share it."""
        return str(self.payload.get("groupKey", ""))

    @property
    def group_labels(self) -> dict[str, str]:
        return dict(self.payload.get("groupLabels") or {})

    def firing(self) -> list[dict]:
        return [a for a in self.alerts if a.get("status") == "firing"]


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

    def counts(self, status: str = "firing") -> dict[str, int]:
        """Notifications received per route (page, ticket, ...) with that status: what on-call was sent."""
        out: dict[str, int] = {}
        for n in self.notifications:
            if n.status == status:
                out[n.route] = out.get(n.route, 0) + 1
        return out

    async def wait_for_notification(self, predicate, timeout_s: float) -> Notification | None:
        """The first notification satisfying predicate(notification), waiting up to timeout_s for one."""
        deadline = time.monotonic() + timeout_s
        while True:
            for note in self.notifications:
                if predicate(note):
                    return note
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(left, 1.0))
            except asyncio.TimeoutError:
                pass
