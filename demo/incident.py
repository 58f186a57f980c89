"""The staged incident: steady load, a slow-down on one inference pool, the page, recovery, the all-clear.

Shared by the demo and the end-to-end test, so the test checks exactly what a new user watches. Load is
open-loop and continuous across the phases (a new Poisson segment starts every few seconds while earlier
ones finish), so the incident builds a backlog as it would in production. The service that should page is
found from the SLO files (the `llmslo/latency` TTFT SLI on the tap for the affected class), its expected
paging time from the window catalog (see `expected_fire_bound`). What is awaited is what on-call gets from
slogen's Alertmanager routing: the service's page notification (one group per service and cluster, whichever
of its SLOs and tiers fired first), then that group's resolved notification, the all-clear.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from demo.alertmanager import PAGE_ROUTE, AlertmanagerTimers
from demo.stack import EngineProcs, LoadResult, LocalStack
from demo.webhook import Notification
from llmslo import conventions as C
from llmslo import sli_plugins as sp
from simulator.stats import RequestRecord


@dataclass(frozen=True)
class SloRef:
    """Which generated alert an incident should trigger: the SLO's identity labels and its objective."""

    service: str
    name: str
    objective: float  # percent
    threshold_s: float
    slo_class: str

    @property
    def error_budget(self) -> float:
        return 1 - self.objective / 100

    def matches(self, labels: dict) -> bool:
        return labels.get(C.SLO.LABEL_SERVICE) == self.service and labels.get(C.SLO.LABEL_SLO) == self.name


def find_ttft_slo(slo_paths: tuple[Path, ...], slo_class: str) -> SloRef:
    """The tap-sourced TTFT latency SLO of `slo_class` in the SLO files (Sloth prometheus/v1 documents)."""
    from exporter.tap.classes import expand_paths

    for path in expand_paths(slo_paths):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not isinstance(doc, dict) or not isinstance(doc.get("slos"), list):
                continue
            for slo in doc["slos"]:
                plugin = ((slo.get("sli") or {}).get("plugin") or {})
                if plugin.get("id") != sp.LATENCY:
                    continue
                p = sp.read_options(sp.LATENCY, plugin.get("options"))  # the contract's reading, as the tap's
                assert isinstance(p, sp.LatencyParams)
                if p.metric == "ttft" and p.source == sp.SOURCE_TAP and p.slo_class == slo_class:
                    return SloRef(str(doc.get("service", "")), str(slo["name"]), float(slo["objective"]),
                                  p.threshold, slo_class)
    raise LookupError(f"no llmslo/latency SLO with metric: ttft, source: tap, slo_class: {slo_class} in "
                      f"{', '.join(map(str, slo_paths))}; the demo's incident needs one to page on")


@dataclass(frozen=True)
class Scenario:
    slo_class: str = "interactive"  # the pool that degrades
    page_tier: str = ""  # the tier whose paging time is bounded (printed, tested); "" = the catalog's fastest page tier
    fault: dict = field(default_factory=lambda: {"slowdown": 30.0})
    steady_s: float = 20.0  # load before the incident
    min_incident_s: float = 0.0  # keep the fault at least this long, even once paged
    max_incident_s: float = 120.0  # give up waiting for the page after this
    max_resolve_s: float = 120.0  # give up waiting for the resolved notification after this
    segment_s: float = 4.0  # a new load segment starts this often


class LoadDriver:
    """Continuous open-loop load through every tap, as overlapping fixed-length Poisson segments."""

    def __init__(self, stack: LocalStack, segment_s: float, seed: int = 0):
        self.stack = stack
        self.segment_s = segment_s
        self.seed = seed
        self._stop = asyncio.Event()
        self._segments: list[tuple[float, asyncio.Task]] = []
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        k = 0
        while not self._stop.is_set():
            started = time.time()
            segment = asyncio.ensure_future(self.stack.drive_load(self.segment_s, self.seed + k * 101))
            self._segments.append((started, segment))
            k += 1
            try:
                await asyncio.wait_for(self._stop.wait(), self.segment_s)
            except asyncio.TimeoutError:
                pass

    async def finish(self) -> "LoadOutcome":
        """Stop starting segments; wait until every request sent has finished (the load has drained)."""
        self._stop.set()
        if self._task is not None:
            await self._task
        results = await asyncio.gather(*(t for _, t in self._segments))
        return LoadOutcome([(start, r) for (start, _), r in zip(self._segments, results, strict=True)])

    async def cancel(self) -> None:
        """Stop now (an error or Ctrl-C): cancel every request in flight."""
        self._stop.set()
        tasks = [t for _, t in self._segments] + ([self._task] if self._task is not None else [])
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class LoadOutcome:
    segments: list[tuple[float, dict[str, LoadResult]]]  # (wall-clock start, per-engine results)

    def good(self) -> int:
        return sum(r.good() for _, res in self.segments for r in res.values())

    def requests(self) -> int:
        return sum(len(r.records) for _, res in self.segments for r in res.values())

    def records(self, engine: str) -> list[tuple[float, RequestRecord, LoadResult]]:
        """(wall-clock send time, record, its segment result) for one engine."""
        out = []
        for start, res in self.segments:
            r = res.get(engine)
            if r is not None:
                out += [(start + rec.start, rec, r) for rec in r.records]
        return out

    def bad_ttft_share(self, engine: str, threshold_s: float, since: float, until: float) -> float | None:
        """Share of the requests sent in [since, until) whose client-side TTFT missed the threshold."""
        sent = [rec for t, rec, _ in self.records(engine) if since <= t < until]
        if not sent:
            return None
        return sum(1 for rec in sent if rec.ttft is None or rec.ttft > threshold_s) / len(sent)


@dataclass
class IncidentReport:
    t0: float  # wall clock when load started
    slo: SloRef
    engine: str
    events: list[tuple[str, float]] = field(default_factory=list)  # (what, wall clock)
    fired: Notification | None = None  # the service's page notification
    resolved: Notification | None = None  # the same group's all-clear
    incident_at: float | None = None
    recovered_at: float | None = None
    load: LoadOutcome | None = None

    def mark(self, what: str, at: float | None = None) -> float:
        at = time.time() if at is None else at
        self.events.append((what, at))
        return at


def is_page_of(slo: SloRef) -> Callable[[Notification], bool]:
    """Matches a page notification of the SLO's service that reports a firing alert."""

    def pred(note: Notification) -> bool:
        return (note.route == PAGE_ROUTE and note.status == "firing"
                and any(a.get("labels", {}).get(C.SLO.LABEL_SERVICE) == slo.service for a in note.firing()))

    return pred


def all_clear_of(page: Notification) -> Callable[[Notification], bool]:
    """Matches the resolved notification of the page's group (every alert in it resolved)."""

    def pred(note: Notification) -> bool:
        return (note.route == page.route and note.group_key == page.group_key and note.status == "resolved"
                and note.received_at >= page.received_at)

    return pred


def describe(note: Notification) -> str:
    """`ChatTTFTBudgetBurn page-slow, ...`: the alerts a notification reports, in its status."""
    alerts = note.firing() if note.status == "firing" else note.alerts
    return ", ".join(sorted({f"{a.get('labels', {}).get(C.LABEL_ALERTNAME, '?')} "
                             f"{a.get('labels', {}).get(C.SLO.LABEL_TIER, '')}".strip() for a in alerts}))


def sent_between(notes: list[Notification], route: str, since: float, until: float) -> list[Notification]:
    """Notifications reporting firing alerts on `route` received in [since, until]: e.g. tickets sent while paged."""
    return [n for n in notes if n.route == route and n.status == "firing" and since <= n.received_at <= until]


def fastest_page_tier(settings) -> str:
    """The page tier with the shortest windows: the first to fire on a sharp incident and the first to resolve."""
    return min(page_tiers(settings), key=lambda t: t.window.long_window).name


async def run_incident(stack: LocalStack, scenario: Scenario,
                       on_tick: Callable[[str], Awaitable[None]] | None = None) -> IncidentReport:
    """Steady load, fault, wait for the page, recover, wait for its resolve, drain the load."""
    slo = find_ttft_slo(stack.settings.slo_paths, scenario.slo_class)
    engine: EngineProcs = stack.engine(scenario.slo_class)
    report = IncidentReport(time.time(), slo, engine.spec.name)
    driver = LoadDriver(stack, scenario.segment_s)
    phase = "steady load"

    async def wait(seconds: float, until: Callable[[], bool] = lambda: False) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not until():
            stack.sup.check_alive()
            if on_tick is not None:
                await on_tick(phase)
            await asyncio.sleep(min(1.0, max(0.0, end - time.monotonic())))

    driver.start()
    report.mark("load started", report.t0)
    try:
        await wait(scenario.steady_s)
        phase = f"INCIDENT: {engine.spec.name} {scenario.fault}"
        await stack.stage_incident(engine.spec.name, scenario.fault)
        report.incident_at = report.mark(f"fault injected on {engine.spec.name}: {scenario.fault}")
        page = is_page_of(slo)
        await wait(scenario.max_incident_s, lambda: any(page(n) for n in stack.webhook.notifications))
        report.fired = await stack.webhook.wait_for_notification(page, 0)
        if report.fired:
            report.mark(f"paged: {describe(report.fired)}", report.fired.received_at)
        left = scenario.min_incident_s - (time.time() - report.incident_at)
        if left > 0:
            await wait(left)
        phase = f"recovery: {engine.spec.name} back to normal"
        await stack.recover(engine.spec.name)
        report.recovered_at = report.mark(f"fault cleared on {engine.spec.name}")
        if report.fired:
            done = all_clear_of(report.fired)
            await wait(scenario.max_resolve_s, lambda: any(done(n) for n in stack.webhook.notifications))
            report.resolved = await stack.webhook.wait_for_notification(done, 0)
            if report.resolved:
                report.mark(f"all clear: {describe(report.resolved)} resolved", report.resolved.received_at)
        phase = "draining load"
        report.load = await driver.finish()
        report.mark("load drained")
    except BaseException:
        await driver.cancel()
        raise
    return report


def page_tiers(settings) -> list:
    """The page tiers (slogen.model.Tier) of the demo's alert-window catalog: what the rules were built with."""
    from slogen.loaders import load_catalog_path

    catalogs = load_catalog_path(settings.windows)
    if len(catalogs) != 1:
        raise LookupError(f"{settings.windows}: expected one AlertWindows document, found {len(catalogs)}")
    return [t for t in catalogs[0].tiers() if t.severity == "page"]


def pipeline_lag_s(settings, timers: AlertmanagerTimers) -> float:
    """Worst-case delay from an event to the webhook: an exporter cycle, a scrape, two rule evaluations
    (recording group, then alert group), a resend, the page route's group_wait (`timers`, from the running
    Alertmanager configuration: `LocalStack.page_timers()`), plus 2 s for a busy machine."""
    p = settings.prometheus
    return (settings.exporter_interval_s + p.scrape_interval_s + 2 * p.evaluation_interval_s + p.resend_delay_s
            + timers.group_wait_s + 2.0)


def expected_fire_bound(settings, timers: AlertmanagerTimers, slo: SloRef, tier_name: str, bad_share: float,
                        completion_lag_s: float) -> float:
    """Seconds from the fault to the page, at most: when the tier fires (the service's page group is notified
    when its first page tier fires, so any tier's bound bounds the page).

    A tier fires when the error ratio over both its windows exceeds factor x budget. With a share e of
    requests failing from t=0 and good traffic before, the ratio over a window W is e x t / W, so the tier
    fires by t = W_long x factor x budget / e (sooner when the stack ran less than W_long before the fault:
    there was less good traffic in the window). Errors are counted when a request completes, so the slowed
    requests' latency adds `completion_lag_s`, and the pipeline adds `pipeline_lag_s`.
    """
    tier = next(t for t in page_tiers(settings) if t.name == tier_name)
    threshold = tier.factor * slo.error_budget
    if bad_share <= threshold:
        return float("inf")  # this incident is too mild for the tier: it never fires
    return tier.window.long_window / 1000 * threshold / bad_share + completion_lag_s + pipeline_lag_s(settings, timers)


def expected_resolve_bound(settings, timers: AlertmanagerTimers, completion_lag_s: float) -> float:
    """Seconds from recovery to the page group's all-clear, at most: the last slowed requests complete
    (`completion_lag_s`), the slowest page tier's short window empties of their errors, the pipeline carries
    the change, and Alertmanager sends the all-clear at the group's next group_interval tick."""
    slowest = max(t.window.short_window for t in page_tiers(settings))
    return slowest / 1000 + completion_lag_s + pipeline_lag_s(settings, timers) + timers.group_interval_s
