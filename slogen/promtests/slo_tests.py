"""promtool unit tests for the generated rules, one file per service.

For every SLO whose source series slogen can synthesize (the llmslo/* plugins, and simple
Sloth events SLIs of the form `sum(rate(metric{...}[{{.window}}]))`), these scenarios:
  * full outage: clean traffic for the longest page window, then 100% bad events until every
    enabled tier has fired, then recovery until all have resolved;
  * slow burn: a burn rate between the fastest ticket tier and the slowest page tier, so the
    ticket tiers fire and the page tiers must not;
  * engine hang (SLIs with "late" series, the tap's): the same clean history, then 2h in which
    nothing completes (the latency histograms and goodput counters stop, `ok` stops) and every
    request ends late instead, once per late outcome (upstream_timeout, client_gave_up): the
    error ratio is 1 as in an outage, but it comes from other series, and a latency SLI that
    reads only its histograms would never fire;
  * low traffic (SLOs whose pages the low-traffic guard covers): 6 requests an hour, one every
    10 minutes; one failed request fires the guarded page tiers' ticket twins (and whichever
    ticket tiers it crosses) but no page; a full outage at that traffic still pages, once its
    long window holds page_min_bad_events failed requests;
  * threshold change (tap-sourced latency SLOs, issue 35): the taps reload a changed threshold; the old
    configuration's histogram series (no bucket at the new threshold) stop and new ones (another `buckets`
    label) start at 0 with it. Healthy: nothing fires and the period error budget keeps its value from
    before the change; every request slower than the new threshold after it: the tiers fire as simulated;
  * no data: no source series, so the no-data alert fires after its `for`; and, per cluster
    (the SLI's `by`, or the `cluster` of its sources when it sums them), one cluster of two going
    dark fires it for that cluster only.
Expectations come from promtests/simulate.py, and each check is placed on both sides of a
tier's transition at steps where no deciding ratio is within 5% of its threshold, so the tests
pin the firing and resolving times to one evaluation interval without being brittle.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from llmslo import conventions as c
from llmslo.conventions import SLO as C
from llmslo.durations import format_prometheus_duration
from llmslo.gofloat import go_g
from llmslo.selectors import Matcher, parse_selector
from llmslo.sli_plugins import SOURCE_TAP, LatencyParams
from slogen.model import EventsSLI, Rule, SeriesFixture, Tier
from slogen.plugins.contract import PluginError
from slogen.plugins.llm import le_label
from slogen.promtests.simulate import Simulation, simulate
from slogen.rules import SLOResult
from slogen.rules.alerts import (
    kept_labels,
    low_traffic_tier,
    no_data_alert_name,
    no_data_lookback,
    no_data_scope,
    no_data_selectors,
    rendered,
    sli_by,
)
from slogen.rules.bucket_alerts import bucket_edge_tests
from slogen.rules.scope import fired_labels
from slogen.rules.sli import user_written
from slogen.rules.tiers import held_windows, page_min_bad_events

UNITS_PER_STEP = 1000.0  # events per evaluation step in synthetic traffic
LOW_TRAFFIC_PER_HOUR = 6  # requests an hour in the low-traffic scenarios: one every 10 minutes
STEPS_PER_BASE_WINDOW = 1
HANG_MS = 2 * 3_600_000  # how long the engine hangs in the hang scenarios


@dataclass
class SkippedSLO:
    slo_id: str
    reason: str


def test_step(results: list[SLOResult]) -> int:
    """One evaluation interval for a service's tests: the shortest base window."""
    steps = [r.ctx.base_window // STEPS_PER_BASE_WINDOW for r in results]
    step = min(steps) if steps else 60_000
    for r in results:
        for w in [*r.ctx.windows.windows(), r.ctx.period]:
            step = math.gcd(step, w)
    return step


def service_tests(results: list[SLOResult], rule_file: str, step: int | None = None,
                  history: int | None = None) -> tuple[dict | None, list[SkippedSLO]]:
    """The promtool test-file document for one service's rule file, and the SLOs left out (with why).

    `step` (the evaluation interval) defaults to the base window (5m): each tier is pinned to
    one evaluation while promtool runs a service's tests in seconds; pass a finer step to pin
    the fast tiers tighter. `history` (ms of clean traffic before each incident) defaults to
    the longest page window, so the page tiers see a full window and fire at textbook times.
    """
    step = step or test_step(results)
    names: dict[str, int] = {}
    for r in results:
        for rule in r.rules.alerts.rules:
            names[rule.alert] = names.get(rule.alert, 0) + 1
    tests, skipped = [], []
    for r in results:
        reason = _skip_reason(r, names)
        fixtures = _fixtures(r) if not reason else ()
        if not reason and not fixtures:
            reason = "cannot synthesize its source series (only llmslo/* plugins and sum(rate(metric{...})) events SLIs)"
        if reason:
            skipped.append(SkippedSLO(r.slo.id, reason))
            continue
        tests += _slo_tests(r, fixtures, step, history)
        tests += bucket_edge_tests(r, step)  # rules/bucket_alerts.py: a cluster without the threshold's bucket
    if not tests:
        return None, skipped
    # Evaluate groups in file order (SLI, metadata, alerts per SLO), so alerts see the ratios
    # recorded at the same timestamp; promtool's default order is unspecified.
    order = [g.name for r in results for g in r.rules.groups()]
    doc = {"rule_files": [rule_file], "evaluation_interval": format_prometheus_duration(step), "group_eval_order": order,
           "tests": tests}
    return doc, skipped


def _skip_reason(r: SLOResult, names: dict[str, int]) -> str:
    if r.ctx.opts.sloth_compat:
        return "--sloth-compat rules are Sloth's; tests cover slogen's own rules"
    tier_rules = [x for x in r.rules.alerts.rules if x.labels.get(C.LABEL_TIER) not in (None, "no-data")]
    if not tier_rules:
        return "alerting is disabled"
    if any(names[x.alert] > _own_count(r, x.alert) for x in r.rules.alerts.rules):
        return "its alert name is shared with another SLO of the service"
    if not r.rules.sli.rules:
        return "recording rules are disabled"
    return ""


def _own_count(r: SLOResult, name: str) -> int:
    return sum(1 for x in r.rules.alerts.rules if x.alert == name)


# ------------------------------------------------------------------------------ fixtures


def _fixtures(r: SLOResult) -> tuple[SeriesFixture, ...]:
    sli = r.slo.sli
    if not isinstance(sli, EventsSLI):
        return ()
    return sli.fixtures or infer_fixtures(sli)


_RATE_SEL = re.compile(r"(?:rate|increase)\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^{}]*\})?\s*\[\{\{\s*\.window\s*\}\}\]\s*\)")
_CANDIDATES = ("500", "503", "429", "200", "201", "404", "error", "ok", "true", "false", "1", "0", "fail", "success")


def infer_fixtures(sli: EventsSLI) -> tuple[SeriesFixture, ...]:
    """Series for `sum(rate(m{total matchers}[w]))` over `sum(rate(m{total + error matchers}[w]))`."""
    errs, tots = _RATE_SEL.findall(sli.error_query), _RATE_SEL.findall(sli.total_query)
    if len(errs) != 1 or len(tots) != 1 or errs[0][0] != tots[0][0]:
        return ()
    by = kept_labels(sli.total_query)
    if re.search(r"\b(by|without)\s*\(", sli.total_query + sli.error_query) and not (
            by and kept_labels(sli.error_query) == by):
        return ()  # it keeps labels we cannot name, or the two queries keep different ones
    try:
        em, tm = parse_selector(errs[0][1] or ""), parse_selector(tots[0][1] or "")
    except PluginError:
        return ()
    extra = [m for m in em if m not in tm]
    if not extra:
        return ()
    bad = _satisfy(tm + em)
    good = None
    for i in range(len(extra)):
        good = _satisfy(tm, violate=extra[i])
        if good is not None:
            break
    if bad is None or good is None:
        return ()
    metric = tots[0][0]
    scope = {label: f"{label}-a" for label in by}
    return (SeriesFixture(metric, {**good, **scope}, "good"), SeriesFixture(metric, {**bad, **scope}, "bad"))


def _matches(op: str, pattern: str, value: str) -> bool:
    if op == "=":
        return value == pattern
    if op == "!=":
        return value != pattern
    try:
        hit = re.fullmatch(pattern.replace("\\\\", "\\"), value) is not None
    except re.error:
        return False
    return hit if op == "=~" else not hit


def _satisfy(matchers: Sequence[Matcher], violate: Matcher | None = None) -> dict[str, str] | None:
    labels: dict[str, str] = {}
    names = sorted({m[0] for m in matchers} | ({violate[0]} if violate else set()))
    for name in names:
        mine = [m for m in matchers if m[0] == name]
        eq = [m[2] for m in mine if m[1] == "="]
        candidates = eq + list(_CANDIDATES) if eq else list(_CANDIDATES) + ["fixture"]
        for value in candidates:
            if all(_matches(op, pat, value) for _, op, pat in mine) and (
                    violate is None or violate[0] != name or not _matches(violate[1], violate[2], value)):
                if value or not mine:
                    labels[name] = value
                break
        else:
            return None
    return labels


# ------------------------------------------------------------------------------ scenarios


def _slo_tests(r: SLOResult, fixtures: tuple[SeriesFixture, ...], step: int, history_ms: int | None) -> list[dict]:
    ctx = r.ctx
    tiers = [t for t in ctx.tiers if any(x.labels.get(C.LABEL_TIER) == t.name for x in r.rules.alerts.rules)]
    gauge = any(f.role == "gauge" for f in fixtures)
    page_long = max(ctx.windows.page_quick.long_window, ctx.windows.page_slow.long_window)
    history = (history_ms or page_long) // step
    longest_long = max(t.window.long_window for t in tiers) // step
    longest_short = max(t.window.short_window for t in ctx.tiers) // step
    scenarios: list[Scenario] = []

    # Full outage.
    sim, bad = _run(ctx, tiers, step, gauge, history=history, level=1.0, max_burn=longest_long,
                    recovery=longest_short * 2 + 10)
    if sim is not None:
        name = f"full outage after {format_prometheus_duration(history * step)} of clean traffic"
        scenarios.append(Scenario("outage", _named_page_quick(name, sim, tiers, ctx, history, step, gauge), bad, sim))

    # Slow burn: fast enough for every ticket tier, too slow for any page tier.
    ticket = [t.factor for t in tiers if t.severity == "ticket"]
    page = [t.factor for t in tiers if t.severity == "page"]
    if ticket and (not page or max(ticket) < min(page)):
        k = (max(ticket) + min(page)) / 2 if page else max(ticket) * 1.5
        level = min(1.0, k * float(ctx.error_budget))
        # Page tiers stay quiet whatever the history, so a short one gets the tickets out sooner.
        slow_history = min(history, ctx.windows.page_quick.long_window // step)
        sim2, bad2 = _run(ctx, tiers, step, gauge, history=slow_history, level=level, max_burn=longest_long,
                          recovery=longest_short * 2 + 10)
        if sim2 is not None:
            scenarios.append(Scenario("slow-burn", f"slow burn at {go_g(round(level / float(ctx.error_budget), 3))}x "
                                      f"the budget rate: tickets, no page", bad2, sim2))

    scenarios += _drained_scenario(ctx, tiers, step, gauge, history)
    sli = ctx.slo.sli
    by = sli_by(sli)
    split = by[0] if by and all(by[0] in f.labels for f in fixtures) else ""
    groups = [scenarios] if split and len(scenarios) > 1 else [[s] for s in scenarios]
    # Hangs get groups of their own, so the outage and slow-burn groups stay as they were.
    hangs = _hang_scenarios(ctx, tiers, fixtures, step, history, recovery=longest_short * 2 + 10)
    groups += [hangs] if split and len(hangs) > 1 else [[s] for s in hangs]
    quiet = _low_traffic_scenarios(ctx, tiers, step, gauge, history, recovery=longest_short * 2 + 10)
    groups += [quiet] if split and len(quiet) > 1 else [[s] for s in quiet]
    out = [_test_group(r, fixtures, step, group, tiers, split) for group in groups]
    out += _threshold_change_groups(r, fixtures, step, history, tiers, split)
    out.append(_no_data_group(r, step))
    out += _scope_dark_groups(r, fixtures, step)
    return out


@dataclass
class Scenario:
    """One staged incident. `bad[k]` is the share of step k's requests that fail; a hang
    (`incident` set: the outcome its requests end in) fails them by never completing them."""

    key: str
    name: str
    bad: list[float]
    sim: Simulation
    incident: str = ""
    per_hour: int = 0  # requests an hour, one at a time; 0: UNITS_PER_STEP events every step
    drained_at: int = 0  # from this step on no request arrives (the traffic moved to another cluster); 0: never

    def traffic(self, step: int) -> list[float] | None:
        """Events per step, where they are not UNITS_PER_STEP every step."""
        if self.per_hour:
            return _requests(len(self.bad), step, self.per_hour)
        if self.drained_at:
            return [UNITS_PER_STEP if k < self.drained_at else 0.0 for k in range(len(self.bad))]
        return None


def _named_page_quick(name: str, sim: Simulation, tiers: list[Tier], ctx, history: int, step: int, gauge: bool) -> str:
    """`name`, plus when page-quick fires after the incident starts and the SRE Workbook's figure for it."""
    pq = next((t for t in tiers if t.name == "page-quick"), None)
    if pq is None or not sim.fire_steps(pq.name) or gauge:
        return name
    at = (sim.fire_steps(pq.name)[0] - history + 1) * step  # bad[history] is the step ending at history
    textbook = pq.factor * float(ctx.error_budget) * pq.window.long_window
    return (f"{name}: page-quick fires {format_prometheus_duration(at)} after it starts (SRE Workbook: "
            f"{format_prometheus_duration(int(round(textbook / 1000)) * 1000)}, plus at most one {format_prometheus_duration(step)} evaluation)")


def _hang_scenarios(ctx, tiers: list[Tier], fixtures: tuple[SeriesFixture, ...], step: int, history: int,
                    recovery: int) -> list[Scenario]:
    """One 2h engine hang per late outcome the SLI counts: the error ratio is 1 throughout, as in
    a full outage, so the simulation is the outage's; the series that carry it differ (`_series`)."""
    incidents = list(dict.fromkeys(f.incident for f in fixtures if f.role == "late"))
    if not incidents:
        return []
    hang = -(-HANG_MS // step)
    sim, bad = _run(ctx, tiers, step, False, history=history, level=1.0, max_burn=hang, recovery=recovery, fixed=True)
    if sim is None:
        return []
    first = (f"engine hangs for {format_prometheus_duration(hang * step)} after {format_prometheus_duration(history * step)} of clean "
             f"traffic, every request ending as {incidents[0]}")
    names = [_named_page_quick(first, sim, tiers, ctx, history, step, False)]
    names += [f"the same hang, every request ending as {incident}" for incident in incidents[1:]]
    return [Scenario(f"hang-{incident}", name, list(bad), sim, incident) for incident, name in zip(incidents, names, strict=True)]


def _run(ctx, tiers: list[Tier], step: int, gauge: bool, *, history: int, level: float, max_burn: int,
         recovery: int, fixed: bool = False) -> tuple[Simulation | None, list[float]]:
    """Burn until every tier that can fire has fired (+5 steps), or for exactly `max_burn` steps
    when `fixed`, then recover until all resolve (the guard's ticket twins too); None when no tier fires."""
    bad = _profile(history, level, max_burn, 0, gauge)
    sim = _simulate(ctx, tiers, bad, step, gauge)
    fired = [sim.fire_steps(t.name)[0] for t in tiers if sim.fire_steps(t.name)]
    if not fired:
        return None, bad
    burn = max_burn if fixed else max(fired) - history + 5
    bad = _profile(history, level, burn, recovery, gauge)
    sim = _simulate(ctx, tiers, bad, step, gauge)
    last = max((s[-1] for name in sim.states for s in [sim.resolve_steps(name)] if s), default=len(bad) - 1)
    bad = bad[: last + 3]
    return _simulate(ctx, tiers, bad, step, gauge), bad


def _simulate(ctx, tiers: list[Tier], bad: list[float], step: int, gauge: bool, per_hour: int = 0) -> Simulation:
    """`simulate` with the traffic a scenario's series carry: UNITS_PER_STEP events a step, or `per_hour` requests."""
    if per_hour:
        return simulate(ctx, tiers, bad, step, gauge, traffic=_requests(len(bad), step, per_hour))
    return simulate(ctx, tiers, bad, step, gauge, units=UNITS_PER_STEP)


def _requests(n: int, step: int, per_hour: int) -> list[float]:
    """Requests in each step when one arrives every hour / per_hour (the first at that time, none at 0)."""
    every = 3_600_000 // per_hour
    return [0.0] + [float(k * step // every - (k - 1) * step // every) for k in range(1, n)]


def _drained_scenario(ctx, tiers: list[Tier], step: int, gauge: bool, history: int) -> list[Scenario]:
    """A full outage until every page tier fires, then the traffic drained away (moved to a healthy cluster):
    no request is evidence of nothing, so the pages clear as their short windows empty, not when the traffic
    comes back (alerts._burn's hold ends when the silence is one the long window's traffic makes unusual)."""
    pages = [t for t in tiers if t.severity == "page"]
    if gauge or not held_windows(ctx) or not pages:
        return []
    longest = max(t.window.long_window for t in pages) // step
    outage = _simulate(ctx, tiers, _profile(history, 1.0, longest, 0, gauge), step, gauge)
    fired = [outage.fire_steps(t.name)[0] for t in pages if outage.fire_steps(t.name)]
    if len(fired) < len(pages):
        return []
    drained_at = max(fired) + 3
    tail = 2 * max(t.window.short_window for t in pages) // step + 5
    bad = [0.0] * history + [1.0] * (drained_at - history) + [0.0] * tail
    traffic = [UNITS_PER_STEP if k < drained_at else 0.0 for k in range(len(bad))]
    sim = simulate(ctx, tiers, bad, step, gauge, traffic=traffic)
    cleared = {t.name: (sim.resolve_steps(t.name) or [len(bad)])[-1] - (drained_at - 1) for t in pages}
    name = ("a full outage until every page tier fires, then its traffic drained away: "
            + ", ".join(f"{n} clears {format_prometheus_duration(k * step)} after the last request" for n, k in cleared.items()))
    return [Scenario("drained", name, bad, sim, drained_at=drained_at)]


def _low_traffic_scenarios(ctx, tiers: list[Tier], step: int, gauge: bool, history: int,
                           recovery: int) -> list[Scenario]:
    """At LOW_TRAFFIC_PER_HOUR requests an hour, where the low-traffic guard covers the pages: one
    failed request after clean traffic; a full outage until the pages fire, then recovery. Each runs
    until the page tiers and their ticket twins have settled (the ticket tiers' own resolution,
    hours later, is the high-traffic tests' business)."""
    need = page_min_bad_events(ctx)
    pages = [t.name for t in tiers if t.severity == "page"]
    if gauge or not need or not pages:
        return []
    rate = LOW_TRAFFIC_PER_HOUR
    guarded = pages + [low_traffic_tier(name) for name in pages]
    tail = max(t.window.long_window for t in tiers) // step + recovery

    def settled(sim: Simulation, floor: int) -> int:
        """Steps to keep: past every first firing, and every page or twin resolving, plus 3."""
        ends = [sim.fire_steps(name)[0] for name in sim.states if sim.fire_steps(name)]
        ends += [k for name in guarded if name in sim.states for k in sim.resolve_steps(name)]
        return max(ends + [floor]) + 3

    requests = _requests(history + tail, step, rate)
    at = next(k for k in range(history, len(requests)) if requests[k] >= 1)
    bad = [0.0] * len(requests)
    bad[at] = 1.0 / requests[at]  # one of the step's requests fails
    bad = bad[: settled(_simulate(ctx, tiers, bad, step, gauge, rate), at)]
    one = _simulate(ctx, tiers, bad, step, gauge, rate)
    fired = [name for name in one.states if one.fire_steps(name)]
    tickets = [name for name in fired if name not in pages]
    paged = [name for name in fired if name in pages]
    name = (f"one failed request at {rate} requests/hour after {format_prometheus_duration(history * step)} of clean traffic: "
            + (f"tickets ({', '.join(tickets)})" if tickets else "no ticket")
            + (f", pages ({', '.join(paged)})" if paged else ", no page"))
    out = [Scenario("one-error", name, bad, one, per_hour=rate)]

    sim = _simulate(ctx, tiers, _profile(history, 1.0, tail, 0, gauge), step, gauge, rate)
    fires = sorted((sim.fire_steps(name)[0], name) for name in pages if sim.fire_steps(name))
    if not fires:
        return out  # too few requests in any page window to ever page: nothing more to show
    bad = _profile(history, 1.0, fires[-1][0] - history + 5, recovery, gauge)
    bad = bad[: settled(_simulate(ctx, tiers, bad, step, gauge, rate), history)]
    sim = _simulate(ctx, tiers, bad, step, gauge, rate)
    k, tier = min((sim.fire_steps(name)[0], name) for name in pages if sim.fire_steps(name))
    failed = int(sum(_requests(k + 1, step, rate)[history:]))
    flaps = ", ".join(f"{p} fires {len(sim.fire_steps(p))}x, resolves {len(sim.resolve_steps(p))}x"
                      for p in pages if sim.fire_steps(p))
    name = (f"a full outage at {rate} requests/hour after {format_prometheus_duration(history * step)} of clean traffic: "
            f"{tier} pages {format_prometheus_duration((k - history + 1) * step)} after it starts, at its {_ordinal(failed)} "
            f"failed request (page_min_bad_events: {need}); held while a short window has no requests: "
            f"{flaps} (checked at every evaluation)")
    out.append(Scenario("low-traffic-outage", name, bad, sim, per_hour=rate))
    return out


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _profile(history: int, level: float, burn: int, recovery: int, gauge: bool) -> list[float]:
    """Per-step bad share; a gauge is either saturated or not, so a partial level is spread evenly."""
    if gauge:
        burning = [float(math.floor((i + 1) * level) - math.floor(i * level)) for i in range(burn)]
    else:
        burning = [level] * burn
    return [0.0] * history + burning + [0.0] * recovery


def _checkpoints(sims: list[Simulation], n: int) -> list[int]:
    """Steps on both sides of every tier transition where no scenario is near a threshold."""
    robust = [all(k >= len(sim.bad) or all(states[k].robust for states in sim.states.values()) for sim in sims)
              for k in range(n)]
    points: set[int] = set()
    for sim in sims:
        for name in sim.states:
            for k in sim.fire_steps(name) + sim.resolve_steps(name):
                before = next((j for j in range(k - 1, -1, -1) if robust[j]), None)
                after = next((j for j in range(k, n) if robust[j]), None)
                points.update(j for j in (before, after) if j is not None)
    points.add(max(j for j in range(n) if robust[j]))
    return sorted(points)


def _test_group(r: SLOResult, fixtures, step: int, scenarios: list[Scenario], tiers: list[Tier], split: str) -> dict:
    n = max(len(s.bad) for s in scenarios)
    for s in scenarios:  # pad the shorter scenarios with clean traffic (a drained one stays drained)
        if len(s.bad) < n:
            s.bad = s.bad + [0.0] * (n - len(s.bad))
            gauge = any(f.role == "gauge" for f in fixtures)
            s.sim = (simulate(r.ctx, tiers, s.bad, step, gauge, traffic=s.traffic(step)) if s.drained_at
                     else _simulate(r.ctx, tiers, s.bad, step, gauge, s.per_hour))
    checks = _alert_checks(r, fixtures, step, scenarios, split, n)
    series = []
    for s in scenarios:
        for f in _staged(fixtures, s.incident):
            fx = replace(f, labels={**f.labels, split: s.key}) if split else f
            series.append(_series(fx, s.bad, hang=bool(s.incident), traffic=s.traffic(step),
                                  born=user_written(r.ctx)))
    name = "; ".join(s.name for s in scenarios) + (f" (one {split} each)" if split and len(scenarios) > 1 else "")
    return {"name": f"{r.slo.id}: {name}", "interval": format_prometheus_duration(step), "input_series": series,
            "alert_rule_test": checks}


def _alert_checks(r: SLOResult, fixtures, step: int, scenarios: list[Scenario], split: str, n: int) -> list[dict]:
    """The burn-rate alert's expected alerts at the scenarios' checkpoints (each scenario one `split` value,
    its key), and the no-data alert quiet at the end."""
    by_tier = {x.labels.get(C.LABEL_TIER): x for x in r.rules.alerts.rules}
    alert = next(x.alert for x in r.rules.alerts.rules if x.labels.get(C.LABEL_TIER) != "no-data")
    base_labels = _alert_series_labels(r, fixtures)
    checks: list[dict[str, Any]] = []
    points = _checkpoints([s.sim for s in scenarios], n)
    if any(s.per_hour for s in scenarios):  # low traffic: every robust evaluation, so a flap cannot hide between
        robust = [all(k >= len(s.sim.bad) or all(st[k].robust for st in s.sim.states.values()) for s in scenarios)
                  for k in range(n)]
        points = sorted(set(points) | {k for k in range(n) if robust[k]})
    for k in points:
        exp: list[dict] = []
        for s in scenarios:
            labels = {**base_labels, split: s.key} if split else base_labels
            exp += [_expected(by_tier[name], labels) for name, states in s.sim.states.items()
                    if states[k].firing and name in by_tier]
        checks.append({"eval_time": format_prometheus_duration(k * step), "alertname": alert,
                       "exp_alerts": sorted(exp, key=lambda e: sorted(e["exp_labels"].items()))})
    checks.append({"eval_time": format_prometheus_duration((n - 1) * step), "alertname": no_data_alert_name(alert), "exp_alerts": []})
    return checks


def _staged(fixtures: tuple[SeriesFixture, ...], incident: str) -> list[SeriesFixture]:
    """The series a scenario writes: a "late" series only in the hang that ends in its outcome.

    Left out elsewhere, as the tap leaves it out until its first such request: every other
    scenario also proves that a missing late series costs the SLI nothing.
    """
    return [f for f in fixtures if f.role != "late" or (incident and f.incident == incident)]


def _no_data_group(r: SLOResult, step: int) -> dict:
    rule = next(x for x in r.rules.alerts.rules if x.labels.get(C.LABEL_TIER) == "no-data")
    wait = 2 * r.ctx.base_window
    label_sets = []
    for sel in no_data_selectors(r.ctx):
        labels = _equality_labels(sel)
        if labels not in label_sets:
            label_sets.append(labels)
    return {
        "name": f"{r.slo.id}: no source series, so the no-data alert fires after {format_prometheus_duration(wait)}",
        "interval": format_prometheus_duration(step),
        "input_series": [{"series": 'up{job="unrelated"}', "values": f"1+0x{wait // step + 2}"}],
        "alert_rule_test": [
            {"eval_time": format_prometheus_duration(wait - step), "alertname": rule.alert, "exp_alerts": []},
            {"eval_time": format_prometheus_duration(wait + step), "alertname": rule.alert,
             "exp_alerts": [_expected(rule, labels) for labels in label_sets]},
        ],
    }


LOOKBACK_DELTA_MS = 300_000  # Prometheus' default: how long an instant selector still sees a series after its last sample


def _scope_dark_groups(r: SLOResult, fixtures: tuple[SeriesFixture, ...], step: int) -> list[dict]:
    """Per cluster (the SLI's first `by` label, or the `cluster` of its sources when it sums them):
    two clusters report clean traffic and one goes dark, so the no-data alert fires for that cluster
    only, after its recorded rate (or its sources) lapses plus `for`; and both go dark, so it fires
    once, from `absent()`, not once per cluster."""
    scope = no_data_scope(r.ctx)
    fixtures = tuple(_staged(fixtures, ""))
    # The SLI keeps the scope labels (its `by`), so the arm watches its recorded rate; or it sums
    # them away, so the arm watches its sources, whose series carry `cluster` (added below).
    recorded = bool(sli_by(r.slo.sli))
    if not scope or (recorded and not all(label in f.labels for f in fixtures for label in scope)):
        return []
    rule = next(x for x in r.rules.alerts.rules if x.labels.get(C.LABEL_TIER) == "no-data")
    label = scope[0]
    others = {name: {f.labels.get(name, "") for f in fixtures} for name in scope[1:]}
    if any(len(values) != 1 for values in others.values()):
        return []
    w = max(1, r.ctx.base_window // step)  # steps per base window
    wait = -(-2 * r.ctx.base_window // step)  # the alert's `for`, in steps
    stop = 2 * w + 2  # samples of a cluster that goes dark: enough for its recorded rate to exist
    # Its recorded rate lapses within one base window of its last sample (its sources, within the
    # instant lookback); then `for` runs.
    lapse = w if recorded else -(-LOOKBACK_DELTA_MS // step)
    quiet_until, firing_at = stop + wait - 1, stop + lapse + wait + 2
    if (firing_at - stop + 1) * step >= no_data_lookback(r.ctx):
        return []

    def series(lengths: dict[str, int]) -> list[dict]:
        return [_series(replace(f, labels={**f.labels, label: value}), [0.0] * n)
                for value, n in lengths.items() for f in fixtures]

    one_dark = {label: "dark", **{name: values.pop() for name, values in others.items()}}
    # Both dark: absent() holds once the sources leave the instant lookback; then `for` runs.
    absent_from = -(-((stop - 1) * step + LOOKBACK_DELTA_MS) // step) + 1
    label_sets = []
    for sel in no_data_selectors(r.ctx):
        if (labels := _equality_labels(sel)) not in label_sets:
            label_sets.append(labels)
    return [
        {"name": f"{r.slo.id}: one {label} of two goes dark, so the no-data alert fires for that {label} only",
         "interval": format_prometheus_duration(step),
         "input_series": series({"lit": firing_at + 1, "dark": stop}),
         "alert_rule_test": [
             {"eval_time": format_prometheus_duration(quiet_until * step), "alertname": rule.alert, "exp_alerts": []},
             {"eval_time": format_prometheus_duration(firing_at * step), "alertname": rule.alert,
              "exp_alerts": [_expected(rule, one_dark)]}]},
        {"name": f"{r.slo.id}: every {label} goes dark, so the no-data alert fires once, not once per {label}",
         "interval": format_prometheus_duration(step),
         "input_series": series({"dark": stop, "also-dark": stop}),
         "alert_rule_test": [
             {"eval_time": format_prometheus_duration((absent_from + wait + 1) * step), "alertname": rule.alert,
              "exp_alerts": [_expected(rule, labels) for labels in label_sets]}]},
    ]


def _equality_labels(sel: str) -> dict[str, str]:
    body = sel[sel.index("{"):] if "{" in sel else ""
    try:
        return {n: v for n, op, v in parse_selector(body) if op == "=" and n != "__name__"}
    except PluginError:
        return {}


def _alert_series_labels(r: SLOResult, fixtures) -> dict[str, str]:
    """Labels the recorded error ratios carry into the alert (ids, spec labels, passed-through labels)."""
    labels = {**r.slo.id_labels, **r.ctx.labels}
    for name in sli_by(r.slo.sli):
        values = {f.labels.get(name) for f in fixtures if name in f.labels}
        if len(values) == 1:
            labels[name] = values.pop()
    return labels


def _expected(rule: Rule, series_labels: dict[str, str]) -> dict:
    return {"exp_labels": fired_labels(series_labels, rule),
            "exp_annotations": {k: rendered(v) for k, v in sorted(rule.annotations.items())}}


# Growth of a counter per step, as a share of the step's requests, given its bad share b. In a
# failure the requests complete and fail; in a hang they never complete ("total" and "good"
# stop) and end late instead. A failure has no late series, a hang no completed bad ones.
_GROWTH = {
    False: {"total": lambda b: 1.0, "good": lambda b: 1.0 - b, "bad": lambda b: b, "late": lambda b: 0.0},
    True: {"total": lambda b: 1.0 - b, "good": lambda b: 1.0 - b, "bad": lambda b: 0.0, "late": lambda b: b},
}


def _series(f: SeriesFixture, bad: list[float], hang: bool = False, traffic: list[float] | None = None,
            born: bool = False) -> dict:
    """A fixture's samples. `born`: the user's own counters, which a client library creates at their first
    increase (a `code="500"` series at the first 5xx), so it is absent until then and first reads that 1."""
    labels = ",".join(f'{k}="{v}"' for k, v in sorted(f.labels.items()))
    name = f"{f.name}{{{labels}}}"
    if f.role == "gauge":
        return {"series": name, "values": encode([f.bad_value if b >= 0.5 else f.good_value for b in bad])}
    per_step = _GROWTH[hang][f.role]
    values, acc = [], 0.0
    for k, b in enumerate(bad):
        if k:
            acc += per_step(b) * (UNITS_PER_STEP if traffic is None else traffic[k])
        values.append(round(acc, 6))
    if f.role == "late":
        return {"series": name, "values": _from_first_use(values)}
    if born:
        return {"series": name, "values": _born_at_first_use(values)}
    return {"series": name, "values": encode(values)}


def _born_at_first_use(values: list[float]) -> str:
    """A counter created at its first increase: absent (`_`) until that step, where it reads its first value
    (rate() alone would not see that increase: first_sample.py counts it)."""
    first = next((k for k in range(len(values)) if values[k] > 0), len(values))
    blanks = f"_x{first}" if first else ""
    return " ".join(x for x in (blanks, encode(values[first:])) if x)


def _from_first_use(values: list[float]) -> str:
    """A counter the tap creates on its first use: absent (`_`) until the step before it first grows,
    where it reads 0, so rate() over it is exact from the first late request on."""
    first = next((k for k in range(1, len(values)) if values[k] > 0), len(values))
    start = max(0, first - 1)
    blanks = f"_x{start}" if start else ""
    return " ".join(x for x in (blanks, encode(values[start:])) if x)


def encode(values: list[float]) -> str:
    """promtool's expanding notation: runs of constant increments as `start+stepxN`."""
    out, i, n = [], 0, len(values)
    while i < n:
        j = i
        if i + 1 < n:
            d = round(values[i + 1] - values[i], 6)
            j = i + 1
            while j + 1 < n and abs(round(values[j + 1] - values[j], 6) - d) < 1e-9:
                j += 1
            sign = "+" if d >= 0 else "-"
            out.append(f"{_num(values[i])}{sign}{_num(abs(d))}x{j - i}")
        else:
            out.append(_num(values[i]))
        i = j + 1
    return " ".join(out)


def _num(x: float) -> str:
    return go_g(round(x, 6)) if x else "0"


# ------------------------------------------------------------------------------ a threshold change (issue 35)

CHANGE_SUBSTEPS = 5  # samples per evaluation in the healthy change, so that the tap reloads between two of them
CHANGE_SAMPLE = 2  # ... at this sample of its evaluation step
BUDGET_TOLERANCE = 1e-9
BEFORE, AFTER = "before", "after"  # the LABEL_BUCKETS values of the old and the new configuration's series


def _threshold_change_groups(r: SLOResult, fixtures: tuple[SeriesFixture, ...], step: int, history: int,
                             tiers: list[Tier], split: str) -> list[dict]:
    """A tap-sourced latency SLO's threshold changes on running taps (docs/deploy.md, step 3): the old
    configuration's histogram series (LABEL_BUCKETS=before) lack the new threshold's bucket and stop at the
    change; the new ones (after) start at 0 with it. Healthy, nothing may fire and the period budget may not
    fall; every request slower than the new threshold after the change, the tiers fire when simulate() says."""
    sli = r.slo.sli
    if not (isinstance(sli, EventsSLI) and isinstance(sli.params, LatencyParams) and sli.params.source == SOURCE_TAP):
        return []
    total = next((f for f in fixtures if f.role == "total"), None)
    good = next((f for f in fixtures if f.role == "good"), None)
    if total is None or good is None:
        return []
    sets = _ChangeSeries(total, good, le_label(sli.params.threshold), le_label(round(sli.params.threshold * 1.25, 6)))
    out = [_healthy_change(r, sets, step, history, split)] if step % CHANGE_SUBSTEPS == 0 else []
    hurt = _hurt_change(r, fixtures, sets, step, history, tiers, split)
    return out + ([hurt] if hurt else [])


@dataclass(frozen=True)
class _ChangeSeries:
    """The SLI's histogram as the tap exposes it across the change: the old series' buckets are at the old
    threshold (`old_le`) and not at the new one (`new_le`, the SLI's); each set has its own LABEL_BUCKETS."""

    total: SeriesFixture
    good: SeriesFixture
    new_le: str
    old_le: str

    def series(self, where: dict[str, str], buckets: str, count: str, within: str) -> list[dict]:
        """One configuration's set: `_count`, the bucket at its threshold and +Inf (`count`, `within`: values)."""
        le = self.new_le if buckets == AFTER else self.old_le
        labels = {**where, c.LABEL_BUCKETS: buckets}
        return [{"series": _series_name(self.total.name, {**self.total.labels, **labels}), "values": count},
                {"series": _series_name(self.good.name, {**self.good.labels, **labels, c.LABEL_LE: le}), "values": within},
                {"series": _series_name(self.good.name, {**self.good.labels, **labels, c.LABEL_LE: "+Inf"}),
                 "values": count}]


def _series_name(name: str, labels: dict[str, str]) -> str:
    return f"{name}{{{','.join(f'{k}={chr(34)}{v}{chr(34)}' for k, v in sorted(labels.items()))}}}"


def _recorded_history(r: SLOResult, where: dict[str, str], samples: int, every: int, step: int) -> list[dict]:
    """What the rules before the change recorded from the old series: the base window's error and request
    rates (clean traffic, UNITS_PER_STEP a step), one sample per evaluation (`every` samples) up to sample
    `samples`. The derived windows and the period budget sum them, as Prometheus keeps them past the change."""
    base = format_prometheus_duration(r.ctx.base_window)
    out = []
    for name, value in ((C.sli_errors_rate(base), 0.0), (C.sli_total_rate(base), UNITS_PER_STEP / (step / 1000))):
        rule = next(x for x in r.rules.sli.rules if x.record == name)
        values = " ".join(_num(value) if k % every == 0 else "_" for k in range(1, samples + 1))
        out.append({"series": _series_name(name, {**rule.labels, **where}), "values": "_ " + values})
    return out


def _healthy_change(r: SLOResult, sets: _ChangeSeries, step: int, history: int, split: str) -> dict:
    """Every request faster than both thresholds; the tap reloads between two evaluations, so that a `_count`
    which went on past the change (the old design: one series set, the new bucket born at the reload) would put
    the requests just before it in the next base window as too slow, and the period budget would fall."""
    every, sub = CHANGE_SUBSTEPS, step // CHANGE_SUBSTEPS
    change = history * every + CHANGE_SAMPLE  # the sample at which the tap reloads
    end = (2 * history + 2) * every  # a longest page window after the change, and more
    per = _num(UNITS_PER_STEP / every)
    where = {split: "threshold-change"} if split else {}
    old, new = f"0+{per}x{change - 1} stale", f"_x{change} 0+{per}x{end - change}"
    series = (sets.series(where, BEFORE, old, old) + sets.series(where, AFTER, new, new)
              + _recorded_history(r, where, history * every, every, step))
    alert = next(x.alert for x in r.rules.alerts.rules if x.labels.get(C.LABEL_TIER) != "no-data")
    budget = _series_name(C.PERIOD_ERROR_BUDGET_REMAINING, {**r.slo.id_labels, **where})
    since = format_prometheus_duration(end * sub - history * step)  # back to the last evaluation before the change
    at = format_prometheus_duration(end * sub)
    name = (f"{r.slo.id}: threshold changed on running taps ({sets.old_le} s -> {sets.new_le} s) after "
            f"{format_prometheus_duration(history * step)} of clean traffic, between two evaluations: the old "
            f"configuration's series (no le={sets.new_le}) stop, the new ones start at 0 with it; every request fast: "
            f"{alert} never fires and the period error budget stays at its value before the change")
    return {"name": name, "interval": format_prometheus_duration(sub), "input_series": series,
            "promql_expr_test": [
                {"expr": f'max_over_time(ALERTS{{alertname="{alert}",alertstate="firing"}}[{at}])', "eval_time": at,
                 "exp_samples": []},
                {"expr": f"min(min_over_time({budget}[{since}]) - {budget} offset {since}) >= bool {-BUDGET_TOLERANCE!r}",
                 "eval_time": at, "exp_samples": [{"labels": "{}", "value": 1}]}],
            "alert_rule_test": [{"eval_time": at, "alertname": name_, "exp_alerts": []}
                                for name_ in (alert, no_data_alert_name(alert))]}


def _hurt_change(r: SLOResult, fixtures: tuple[SeriesFixture, ...], sets: _ChangeSeries, step: int, history: int,
                 tiers: list[Tier], split: str) -> dict | None:
    """Every request slower than the new threshold from the change on: the rules never measured the old
    configuration (no bucket at their threshold), so their windows start at the change, and the tiers fire when
    simulate() says for traffic that starts there (then recover)."""
    sim, bad = _change_run(r.ctx, tiers, step, history)
    if sim is None:
        return None
    n = len(bad)
    where = {split: "threshold-change"} if split else {}
    old = f"0+{_num(UNITS_PER_STEP)}x{history - 1} stale"
    good, acc = [], 0.0
    for k in range(history, n):
        acc += (1.0 - bad[k]) * UNITS_PER_STEP if k > history else 0.0
        good.append(acc)
    new = f"_x{history} 0+{_num(UNITS_PER_STEP)}x{n - 1 - history}"
    series = sets.series(where, BEFORE, old, old) + sets.series(where, AFTER, new, f"_x{history} {encode(good)}")
    pq = next((t for t in tiers if sim.fire_steps(t.name)), None)
    fires = "" if pq is None else (f": {pq.name} fires {format_prometheus_duration((sim.fire_steps(pq.name)[0] - history) * step)} "
                                   f"after the change")
    scenario = Scenario("threshold-change", "", bad, sim)
    return {"name": (f"{r.slo.id}: threshold changed on running taps ({sets.old_le} s -> {sets.new_le} s) after "
                     f"{format_prometheus_duration(history * step)} of clean traffic, every request slower than "
                     f"{sets.new_le} s from then on{fires}"),
            "interval": format_prometheus_duration(step), "input_series": series,
            "alert_rule_test": _alert_checks(r, fixtures, step, [scenario], split, n)}


def _change_run(ctx, tiers: list[Tier], step: int, history: int) -> tuple[Simulation | None, list[float]]:
    """The hurt change's simulation: no measured traffic up to the change (step `history`), then UNITS_PER_STEP
    requests a step, all bad until every tier that fires has fired (+5 steps), then clean until all resolve."""
    longest_long = max(t.window.long_window for t in tiers) // step
    recovery = max(t.window.short_window for t in ctx.tiers) // step * 2 + 10

    def run(burn: int, clean: int) -> tuple[Simulation, list[float]]:
        bad = [0.0] * (history + 1) + [1.0] * burn + [0.0] * clean
        traffic = [0.0] * (history + 1) + [UNITS_PER_STEP] * (burn + clean)
        return simulate(ctx, tiers, bad, step, False, traffic=traffic), bad

    sim, _ = run(longest_long, 0)
    fired = [sim.fire_steps(t.name)[0] for t in tiers if sim.fire_steps(t.name)]
    if not fired:
        return None, []
    sim, bad = run(max(fired) - history + 5, recovery)
    last = max((s[-1] for name in sim.states for s in [sim.resolve_steps(name)] if s), default=len(bad) - 1)
    burn = max(fired) - history + 5
    sim, bad = run(burn, last + 3 - (history + 1 + burn))
    return sim, bad
