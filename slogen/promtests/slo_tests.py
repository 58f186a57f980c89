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
tier's transition at steps where no deciding ratio is within 5% of its threshold (`checks.py`), so the tests
pin the firing and resolving times to one evaluation interval without being brittle. This module stages the
incidents; the source series come from `fixtures.py` and are written by `series.py`; the no-data and
threshold-change groups are built in `no_data_tests.py` and `threshold_change.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from llmslo.conventions import SLO as C
from llmslo.durations import format_prometheus_duration
from llmslo.gofloat import go_g
from slogen.model import SeriesFixture, Tier
from slogen.promtests.checks import Scenario, alert_checks
from slogen.promtests.fixtures import slo_fixtures
from slogen.promtests.no_data_tests import no_data_group, scope_dark_groups
from slogen.promtests.series import UNITS_PER_STEP, arrivals, fixture_series, staged
from slogen.promtests.simulate import Simulation, simulate
from slogen.promtests.threshold_change import threshold_change_groups
from slogen.rules import SLOResult
from slogen.rules.alerts import low_traffic_tier, sli_by
from slogen.rules.bucket_alerts import bucket_edge_tests
from slogen.rules.sli import user_written
from slogen.rules.tiers import held_windows, page_min_bad_events

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
        fixtures = slo_fixtures(r) if not reason else ()
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
    out += threshold_change_groups(r, fixtures, step, history, tiers, split)
    out.append(no_data_group(r, step))
    out += scope_dark_groups(r, fixtures, step)
    return out


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
    a full outage, so the simulation is the outage's; the series that carry it differ (`fixture_series`)."""
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
        return simulate(ctx, tiers, bad, step, gauge, traffic=arrivals(len(bad), step, per_hour))
    return simulate(ctx, tiers, bad, step, gauge, units=UNITS_PER_STEP)


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

    requests = arrivals(history + tail, step, rate)
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
    failed = int(sum(arrivals(k + 1, step, rate)[history:]))
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


def _test_group(r: SLOResult, fixtures, step: int, scenarios: list[Scenario], tiers: list[Tier], split: str) -> dict:
    n = max(len(s.bad) for s in scenarios)
    for s in scenarios:  # pad the shorter scenarios with clean traffic (a drained one stays drained)
        if len(s.bad) < n:
            s.bad = s.bad + [0.0] * (n - len(s.bad))
            gauge = any(f.role == "gauge" for f in fixtures)
            s.sim = (simulate(r.ctx, tiers, s.bad, step, gauge, traffic=s.traffic(step)) if s.drained_at
                     else _simulate(r.ctx, tiers, s.bad, step, gauge, s.per_hour))
    checks = alert_checks(r, fixtures, step, scenarios, split, n)
    series = []
    for s in scenarios:
        for f in staged(fixtures, s.incident):
            fx = replace(f, labels={**f.labels, split: s.key}) if split else f
            series.append(fixture_series(fx, s.bad, hang=bool(s.incident), traffic=s.traffic(step),
                                  born=user_written(r.ctx)))
    name = "; ".join(s.name for s in scenarios) + (f" (one {split} each)" if split and len(scenarios) > 1 else "")
    return {"name": f"{r.slo.id}: {name}", "interval": format_prometheus_duration(step), "input_series": series,
            "alert_rule_test": checks}
