"""slogen's Alertmanager routing in a real Alertmanager: one incident, one page.

A real Alertmanager on loopback runs the generated configuration (receivers filled with a webhook, as the
demo does); the test posts alerts to its API the way Prometheus would, in the order the demo's staged
slowdown fires them, and counts the webhook's notifications:

* the pages of one service in one cluster (TTFT, TPOT, goodput; page-slow and page-quick) arriving over a
  few seconds are one page notification; another cluster's page is its own;
* the service's burn-rate tickets in that cluster are held back while its page fires; a no-data ticket, a
  ticket of another service and one from a cluster without a page are sent;
* after the incident (pages resolved one by one) the page group sends one all-clear, and a ticket tier still
  firing is sent only once the page has resolved (the follow-up).
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from pathlib import Path

import aiohttp
import pytest
import yaml

from demo.alertmanager import PAGE_ROUTE, TICKET_ROUTE, build_config, start_alertmanager
from demo.procs import Supervisor, lingering_in_groups
from demo.stack import DEMO_WINDOWS  # the demo's compressed alert-window catalog
from demo.webhook import Notification, WebhookReceiver
from llmslo.durations import DAY, MINUTE, SECOND
from slogen.artifacts.alertmanager import ALERTMANAGER_FILE, alertmanager_config
from slogen.build import BuildOptions, build
from slogen.model import AlertWindow, AlertWindows
from slogen.rules.options import GenOptions

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TICKET_TIERS = ("ticket-quick", "ticket-slow")


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def burn(service: str, slo: str, tier: str, cluster: str = "a", **extra: str) -> dict[str, str]:
    """The labels a generated burn-rate (or no-data) alert carries."""
    names = {"ttft": "TTFT", "tpot": "TPOT", "goodput": "Goodput", "availability": "Availability"}
    alert = f"{service.capitalize()}{names.get(slo, slo)}BudgetBurn" + ("NoData" if tier == "no-data" else "")
    severity = "page" if tier.startswith("page") else "ticket"
    return {"alertname": alert, "sloth_service": service, "sloth_slo": slo, "sloth_id": f"{service}-{slo}",
            "slo_tier": tier, "sloth_severity": severity, "severity": "critical" if severity == "page" else "warning",
            "cluster": cluster, **extra}


class Stack:
    """Alertmanager with a configuration, its webhook, and a client posting alerts as Prometheus does."""

    def __init__(self, tmp_path: Path, config: dict):
        self.tmp_path = tmp_path
        self.generated = config
        self.sup = Supervisor(tmp_path / "logs")
        self.webhook = WebhookReceiver(tmp_path / "notifications.jsonl")
        self.url = ""
        self.session: aiohttp.ClientSession | None = None
        self.t0 = 0.0

    async def __aenter__(self) -> "Stack":
        await self.webhook.start()
        try:
            _, self.url = await start_alertmanager(self.sup, self.tmp_path, build_config(self.generated, self.webhook.url))
        except BaseException:
            await self.webhook.stop()
            await self.sup.stop()
            raise
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        self.t0 = time.time()
        return self

    async def __aexit__(self, *exc) -> None:
        groups = self.sup.process_groups()
        if self.session is not None:
            await self.session.close()
        await self.sup.stop()
        await self.webhook.stop()
        assert lingering_in_groups(groups) == []

    async def post(self, *labelsets: dict[str, str], resolved: bool = False) -> None:
        now = time.time()
        body = [{"labels": labels, "annotations": {"summary": labels["alertname"]}, "startsAt": _iso(now - 1),
                 "endsAt": _iso(now if resolved else now + 600)} for labels in labelsets]
        assert self.session is not None
        async with self.session.post(f"{self.url}/api/v2/alerts", json=body) as resp:
            assert resp.status == 200, await resp.text()

    async def at(self, seconds: float) -> None:
        """Sleep until `seconds` after the stack started."""
        await asyncio.sleep(max(0.0, self.t0 + seconds - time.time()))

    def sent(self, route: str, status: str = "firing") -> list[Notification]:
        return [n for n in self.webhook.notifications if n.route == route and n.status == status]


def _names(note: Notification, status: str = "firing") -> set[tuple[str, str, str]]:
    return {(a["labels"]["sloth_service"], a["labels"]["slo_tier"], a["labels"]["cluster"])
            for a in note.alerts if a["status"] == status}


def _generated_demo_config() -> dict:
    """What `slogen build --windows demo/windows.yaml --override-period 1d` writes to alerts/alertmanager.yaml."""
    options = BuildOptions(inputs=(str(REPO / "slos"),), windows_paths=(str(DEMO_WINDOWS),),
                           gen=GenOptions(period_override=DAY), autoscaling=False)
    artifacts = build(options).files
    return yaml.safe_load(artifacts[ALERTMANAGER_FILE])


def test_one_service_incident_is_one_page_and_silences_its_tickets(tmp_path):
    """The demo's catalog as generated (page group_wait 1s, group_interval 2m; ticket group_wait 10s)."""
    config = _generated_demo_config()
    page_route = config["route"]["routes"][0]
    assert (page_route["group_wait"], page_route["group_interval"], config["route"]["group_wait"]) == ("1s", "2m", "10s")

    async def body() -> Stack:
        async with Stack(tmp_path, config) as s:
            # the first evaluation after a slowdown: TTFT page-slow with both TTFT tickets
            await s.post(burn("chat", "ttft", "page-slow"), burn("chat", "ttft", "ticket-quick"),
                         burn("chat", "ttft", "ticket-slow"))
            await s.at(2.5)  # after the page's first notification: these join an open incident
            await s.post(burn("chat", "tpot", "page-slow"), burn("chat", "tpot", "ticket-quick"),
                         burn("chat", "ttft", "page-quick"), burn("chat", "goodput", "ticket-slow"))
            await s.at(4.0)
            await s.post(burn("chat", "goodput", "page-slow"), burn("chat", "tpot", "page-quick"),
                         # controls: not silenced by chat's page in cluster a
                         burn("chat", "ttft", "no-data"),  # the monitoring is blind: another problem
                         burn("batch", "ttft", "ticket-quick"),  # another service
                         burn("chat", "tpot", "ticket-quick", cluster="c"),  # a cluster with no page
                         burn("chat", "availability", "page-quick", cluster="b"))  # another cluster's incident
            await s.at(17.0)  # every ticket group has passed its 10 s group_wait
            return s

    s = asyncio.run(body())
    pages = s.sent(PAGE_ROUTE)
    assert [sorted(_names(n)) for n in pages] == [
        [("chat", "page-slow", "a")],  # one page for cluster a: the alerts that joined it wait for group_interval
        [("chat", "page-quick", "b")],
    ], [n.payload for n in pages]
    tickets = s.sent(TICKET_ROUTE)
    assert sorted(sorted(_names(n)) for n in tickets) == [
        [("batch", "ticket-quick", "a")],
        [("chat", "no-data", "a")],
        [("chat", "ticket-quick", "c")],
    ], [n.payload for n in tickets]
    assert s.webhook.counts() == {PAGE_ROUTE: 2, TICKET_ROUTE: 3}
    assert s.sent(PAGE_ROUTE, "resolved") == []


def _short_catalog() -> AlertWindows:
    """A catalog whose derived timers fit a test: page group_wait 1s, page group_interval 12s, ticket group_wait 9s."""
    s = SECOND
    return AlertWindows(DAY, page_quick=AlertWindow(2, 9 * s, 2 * MINUTE), page_slow=AlertWindow(5, 6 * s, 12 * MINUTE),
                        ticket_quick=AlertWindow(10, MINUTE, 48 * MINUTE), ticket_slow=AlertWindow(10, 2 * MINUTE, 120 * MINUTE))


def test_the_incident_ends_with_one_all_clear_and_tickets_wait_for_it(tmp_path):
    config = alertmanager_config([_short_catalog()], TICKET_TIERS)
    page_route = config["route"]["routes"][0]
    assert (page_route["group_wait"], page_route["group_interval"], config["route"]["group_wait"]) == ("1s", "12s", "9s")
    ttft_s, ttft_q, goodput_s = (burn("chat", "ttft", "page-slow"), burn("chat", "ttft", "page-quick"),
                                 burn("chat", "goodput", "page-slow"))
    ticket = burn("chat", "ttft", "ticket-quick")
    times: dict[str, float] = {}

    async def body() -> Stack:
        async with Stack(tmp_path, config) as s:
            await s.post(ttft_s, ticket)
            await s.at(3.0)
            await s.post(goodput_s, ttft_q)  # join the open incident
            await s.at(4.5)
            await s.post(ttft_q, resolved=True)  # one tier clears first: no notification for it
            await s.at(6.5)
            await s.post(ttft_s, goodput_s, resolved=True)  # the incident is over; the ticket tier still fires
            times["resolved"] = time.time()
            done = await s.webhook.wait_for_notification(
                lambda n: n.route == PAGE_ROUTE and n.status == "resolved", 20.0)
            assert done is not None, [n.payload for n in s.webhook.notifications]
            await s.at(max(time.time() - s.t0, 9.0) + 1.0)
            return s

    s = asyncio.run(body())
    notes = s.webhook.notifications
    assert [(n.route, n.status) for n in notes] == [(PAGE_ROUTE, "firing"), (TICKET_ROUTE, "firing"),
                                                   (PAGE_ROUTE, "resolved")], [n.payload for n in notes]
    page, follow_up, all_clear = notes
    assert _names(page) == {("chat", "page-slow", "a")}
    assert _names(all_clear, "resolved") == {("chat", "page-slow", "a"), ("chat", "page-quick", "a")}
    assert len(all_clear.alerts) == 3 and all_clear.group_key == page.group_key
    assert follow_up.received_at >= times["resolved"], "the ticket was sent while the page still fired"
    assert _names(follow_up) == {("chat", "ticket-quick", "a")}
