"""Grafana dashboards generated from the SLOs: one per SLO, plus the fleet serving dashboard.

Why generated: the dashboards must query exactly the series the exporter, the tap and the
generated rules produce. Every name below comes from `llmslo.conventions`, every SLO number
from the spec, so a rename or a new SLO changes the dashboards in the same `slogen build`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import attr
from grafanalib import core as g

from llmslo import conventions as c
from llmslo import gateways as gw
from llmslo.conventions import CAPACITY as K
from slogen import promql as q
from slogen.artifacts import gateway_panels as gp
from slogen.artifacts import grafana as gf
from slogen.artifacts import overview as ov
from slogen.links import FLEET_DASHBOARD_UID, OVERVIEW_DASHBOARD_UID, slo_dashboard_uid
from slogen.panels import (
    ENGINE_BY,
    GATEWAY_AVAILABILITY_TITLE,
    GPUS_BY_POOL_TITLE,
    LATE_TITLE,
    POOL_BY,
    QUANTILES,
    REFUSALS_TITLE,
    WAITING_BY_REASON_TITLE,
    gateway_latency_title,
)
from slogen.paths import FLEET_DASHBOARD_FILE, OVERVIEW_DASHBOARD_FILE, slo_dashboard_path
from slogen.rules import isolation
from slogen.views import (
    SLI_AVAILABILITY,
    SLI_GOODPUT,
    SLI_KV_HEADROOM,
    SLI_LATENCY,
    SLOView,
    window_seconds,
)

TAGS = ["llmslo"]
RATE = "$__rate_interval"

# Template variables: Grafana name -> label it filters.
CLUSTER_VAR = "cluster"
FLEET_VARIABLES = (
    (CLUSTER_VAR, c.LABEL_CLUSTER),
    ("namespace", c.LABEL_NAMESPACE),
    ("model", c.LABEL_MODEL),
    ("node", c.LABEL_NODE),
)


# Per-engine and per-pool panels keep `cluster`: with the cluster variable on All (a fleet store), two clusters'
# pods of one name (a StatefulSet's chat-0) or pools of one namespace and model are different lines, not one sum.
# An engine is every identity label the exporter writes (conventions.ENGINE_IDENTITY_LABELS): engines configured
# as static targets have no pod or namespace, and only their node, kind and model tell them apart.
ENGINE_LEGEND = "{{namespace}}/{{pod}} {{model}} ({{engine}} on {{node}}) {{cluster}}"
POOL_LEGEND = "{{namespace}}/{{model}} {{cluster}}"


def _var(name: str) -> str:
    return "$" + name


# --------------------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------------------
@dataclass
class _Grid:
    """Places panels left to right in Grafana's 24-column grid, wrapping to a new line."""

    x: int = 0
    y: int = 0
    line_height: int = 0
    next_id: int = 1

    def place(self, panel, w: int, h: int):
        if self.x + w > 24:
            self.newline()
        placed = _with(panel, gridPos=g.GridPos(h=h, w=w, x=self.x, y=self.y), id=self.next_id)
        self.next_id += 1
        self.x += w
        self.line_height = max(self.line_height, h)
        return placed

    def newline(self) -> None:
        if self.x:
            self.y += self.line_height
        self.x, self.line_height = 0, 0

    def row(self, title: str) -> g.RowPanel:
        self.newline()
        row = g.RowPanel(title=title, gridPos=g.GridPos(h=1, w=24, x=0, y=self.y), id=self.next_id)
        self.next_id += 1
        self.y += 1
        return row


def _with(panel, **changes):
    return attr.evolve(panel, **changes)


def _timeseries(title: str, targets: Sequence[g.Target], *, unit: str = "short", description: str = "",
                steps: Sequence[tuple[float | None, str]] = (), threshold_style: str = "off",
                stack: bool = False, draw: str = "line", fill: int = 10) -> g.TimeSeries:
    return g.TimeSeries(
        title=title, description=description, dataSource=gf.PROMETHEUS, targets=list(targets), unit=unit,
        thresholds=gf.thresholds(*steps) if steps else gf.thresholds((None, "green")),
        thresholdsStyleMode=threshold_style, legendDisplayMode="list", legendPlacement="bottom",
        tooltipMode="multi", tooltipSort="desc", fillOpacity=fill, drawStyle=draw,
        stacking={"mode": "normal", "group": "A"} if stack else {"mode": "none", "group": "A"},
    )


def _stat(title: str, targets: Sequence[g.Target], *, unit: str = "short", description: str = "",
          steps: Sequence[tuple[float | None, str]] = ((None, "green"),), decimals: int | None = None,
          time_from: str | None = None) -> g.Stat:
    return g.Stat(
        title=title, description=description, dataSource=gf.PROMETHEUS, targets=list(targets), format=unit,
        thresholds=gf.thresholds(*steps), color={"mode": "thresholds"}, colorMode="value", graphMode="area",
        reduceCalc="lastNotNull", decimals=decimals, noValue="No data", timeFrom=time_from,
        hideTimeOverride=time_from is None,
    )


def _dashboard(title: str, uid: str, description: str, panels: list, variables: list[g.Template],
               time_from: str, tags: Sequence[str]) -> g.Dashboard:
    return g.Dashboard(
        title=title, uid=uid, description=description, tags=[*TAGS, *tags], panels=panels,
        templating=g.Templating(list=[gf.datasource_variable(), *variables]),
        time=g.Time(time_from, "now"), timezone="utc", refresh="30s", schemaVersion=gf.SCHEMA_VERSION,
        graphTooltip=1, editable=True, version=1,
        annotations=g.Annotations(list=[{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
            "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard",
        }]),
        timePicker=g.TimePicker(refreshIntervals=["30s", "1m", "5m", "15m"], timeOptions=[]),
    )


# --------------------------------------------------------------------------------------
# Per-SLO dashboard
# --------------------------------------------------------------------------------------
def _slo_matchers(slo: SLOView) -> list[q.Matcher]:
    return [q.eq(c.SLO.LABEL_ID, slo.slo_id), q.regex(c.LABEL_CLUSTER, _var(CLUSTER_VAR))]


def _latency_histogram(slo: SLOView) -> c.MetricDef:
    tap = {"ttft": c.TAP_TTFT, "tpot": c.TAP_TPOT, "e2e": c.TAP_E2E}
    engine = {"ttft": c.TTFT, "tpot": c.TPOT, "e2e": c.E2E, "itl": c.ITL}
    if slo.source == "tap" and slo.latency_metric in tap:
        return tap[slo.latency_metric]
    return engine[slo.latency_metric]


def _source_matchers(slo: SLOView, *, tap: bool) -> list[q.Matcher]:
    matchers = [q.regex(c.LABEL_CLUSTER, _var(CLUSTER_VAR))]
    if tap and slo.slo_class:
        matchers.append(q.eq(c.LABEL_SLO_CLASS, slo.slo_class))
    return matchers


def _has_source_panels(slo: SLOView) -> bool:
    return ((slo.sli_kind == SLI_LATENCY and bool(slo.latency_metric))
            or slo.sli_kind in (SLI_GOODPUT, SLI_AVAILABILITY, SLI_KV_HEADROOM))


# Engine-side histograms are read one engine kind at a time: kinds have different bucket ladders (promql.check_one_ladder).
PER_KIND = (c.LABEL_ENGINE,)


def _sli_outcomes() -> q.Matcher:
    """The tap outcomes a tap SLI counts: every one but the neutral ones (conventions.TAP_NEUTRAL_OUTCOMES)."""
    return q.matcher(c.LABEL_OUTCOME, "!~", q.any_of(c.TAP_NEUTRAL_OUTCOMES))


LATE_NOTE = ("Requests the engine never answered in time (the tap's deadline) or whose client left once the objective "
             "had passed. They never complete, so the latency percentiles and heatmaps cannot show them: during an "
             "engine hang the percentiles go blank or stay low, and this panel rises.")


def _late_requests(matchers: Sequence[q.Matcher], labels: Sequence[str]) -> g.Target:
    """Rate of the tap's late outcomes (conventions.TAP_LATE_OUTCOMES), which the latency SLIs count as slow;
    0, not "No data", where requests flow and none was late (the tap creates an outcome's series on first use)."""
    late = q.matcher(c.LABEL_OUTCOME, "=~", q.any_of(c.TAP_LATE_OUTCOMES))
    legend = " ".join(f"{{{{{label}}}}}" for label in labels) or "late"
    expr = (f"{q.sum_rate(c.TAP_REQUESTS.name, [*matchers, late], RATE, labels)}\nor\n"
            f"0 * {q.sum_rate(c.TAP_REQUESTS.name, matchers, RATE, labels)}")
    return gf.prom_target(expr, legend, "A")


def goodput_ratio(m: list[q.Matcher], by: tuple[str, ...] = (), window: str = RATE) -> str:
    """Goodput over the requests the goodput SLI counts (neutral outcomes left out), 0 for a class that has
    requests but no goodput series yet (the tap creates the counter on a class's first good request).
    The runbooks show the same query."""
    total = q.sum_rate(c.TAP_REQUESTS.name, [*m, _sli_outcomes()], window, by)
    return f"({q.sum_rate(c.GOODPUT_REQUESTS.name, m, window, by)} or 0 * {total}) / {total}"


def _gateway_latency_panels(slo: SLOView, grid: _Grid, title: str, steps) -> list:
    """A gateway-sourced latency SLO: its gateway's histogram, one line per gateway pod (gateway_panels.py)."""
    hist, m = gp.latency_histogram(slo, [q.regex(c.LABEL_CLUSTER, _var(CLUSTER_VAR))])
    gateway = gw.GATEWAYS[slo.source]
    targets = [gf.prom_target(q.histogram_quantile(p, hist, m, RATE, (c.LABEL_POD,)), f"p{round(p * 100)} {{{{pod}}}}",
                              ref) for p, ref in QUANTILES]
    return [grid.place(_timeseries(gateway_latency_title(title, gateway.title), targets, unit="s", steps=steps,
                                   threshold_style="line",
                                   description=f"From {hist.name}, scraped from the {gateway.title} itself (finished "
                                               "requests only: a hang shows as falling traffic), one line per pod."),
                       24, 8)]


def _latency_panels(slo: SLOView, grid: _Grid) -> list:
    if slo.source in gw.GATEWAYS:
        steps = ((None, "green"), (slo.threshold, "red")) if slo.threshold else ((None, "green"),)
        name = slo.latency_metric.upper()
        title = f"{name} percentiles vs the {slo.threshold:g}s threshold" if slo.threshold else f"{name} percentiles"
        return _gateway_latency_panels(slo, grid, title, steps)
    hist = _latency_histogram(slo)
    tap = hist in c.TAP_METRICS
    m = _source_matchers(slo, tap=tap)
    name = slo.latency_metric.upper()
    steps = ((None, "green"), (slo.threshold, "red")) if slo.threshold else ((None, "green"),)
    title = f"{name} percentiles vs the {slo.threshold:g}s threshold" if slo.threshold else f"{name} percentiles"
    if not tap:  # one line per engine kind; no heatmap: a heatmap over several kinds would mix their ladders
        targets = [gf.prom_target(q.histogram_quantile(p, hist, m, RATE, PER_KIND), f"p{round(p * 100)} {{{{engine}}}}",
                                  ref) for p, ref in QUANTILES]
        return [grid.place(_timeseries(f"{title}, per engine kind", targets, unit="s", steps=steps,
                                       threshold_style="line",
                                       description=f"From {hist.name} (engine-side), one line per engine kind: kinds "
                                                   "bucket their latencies differently, and a sum over unlike bucket "
                                                   "ladders would misplace every quantile."), 24, 8)]
    targets = [gf.prom_target(q.histogram_quantile(p, hist, m, RATE), f"p{round(p * 100)}", ref) for p, ref in QUANTILES]
    return [
        grid.place(_timeseries(title, targets, unit="s", steps=steps, threshold_style="line",
                               description=f"From {hist.name} (client-side, the tap; completed requests only)."), 8, 8),
        grid.place(gf.Heatmap(title=f"{name} distribution", dataSource=gf.PROMETHEUS,
                              targets=[gf.prom_target(q.bucket_rates(hist, m, RATE), "{{le}}", heatmap=True)],
                              unit="s", description=f"Bucket rates of {hist.bucket()}: one bucket ladder for every tap."),
                   8, 8),
        grid.place(_timeseries(LATE_TITLE, [_late_requests(m, ())], unit="reqps", description=LATE_NOTE), 8, 8),
    ]


def _source_panels(slo: SLOView, grid: _Grid) -> list:
    """The raw signal behind the SLI, so on-call sees what the ratio is made of."""
    if slo.sli_kind == SLI_LATENCY and slo.latency_metric:
        return _latency_panels(slo, grid)
    if slo.sli_kind == SLI_GOODPUT:
        m = _source_matchers(slo, tap=True)
        counted = q.sum_rate(c.TAP_REQUESTS.name, [*m, _sli_outcomes()], RATE)
        return [grid.place(_timeseries("Requests within objective vs requests the SLI counts", [
            gf.prom_target(f"{q.sum_rate(c.GOODPUT_REQUESTS.name, m, RATE)} or 0 * {counted}", "goodput req/s", "A"),
            gf.prom_target(counted, "counted req/s", "B"),
        ], unit="reqps", description="Goodput requests met both the TTFT and the TPOT objective of their class. Counted: "
                                     "every request of the class but those whose outcome is "
                                     f"{' or '.join(c.TAP_NEUTRAL_OUTCOMES)} (nobody's failure, left out of the SLI)."),
            24, 8)]
    if slo.sli_kind == SLI_AVAILABILITY and slo.source in gw.GATEWAYS:
        failed, counted = gp.availability_queries(slo, [q.regex(c.LABEL_CLUSTER, _var(CLUSTER_VAR))], RATE)
        return [grid.place(_timeseries(GATEWAY_AVAILABILITY_TITLE, [
            gf.prom_target(failed, "failed req/s", "A"), gf.prom_target(counted, "counted req/s", "B")],
            unit="reqps", description=f"From the {gw.GATEWAYS[slo.source].title}'s own counters, as the SLI counts: "
                                      "failed by the gateway or its backend; the client's own faults are in neither "
                                      "(docs/slogen.md, Gateways as SLI sources)."), 24, 8)]
    if slo.sli_kind == SLI_AVAILABILITY:
        if slo.source == "engine":
            m = [q.regex(c.LABEL_CLUSTER, _var(CLUSTER_VAR))]
            target = gf.prom_target(q.sum_rate(c.REQUESTS_FINISHED.name, m, RATE, (c.LABEL_REASON,)), "{{reason}}")
            description = ("Finished requests by the engines' reason. Engine-side, a request whose client went away is "
                           "finished as abort and counts as bad; the tap-side availability SLOs leave a client that "
                           f"left while on time out ({c.OUTCOME_CLIENT_DISCONNECTED}), so the two differ by those.")
        else:
            m = _source_matchers(slo, tap=True)
            target = gf.prom_target(q.sum_rate(c.TAP_REQUESTS.name, m, RATE, (c.LABEL_OUTCOME,)), "{{outcome}}")
            description = (f"The tap's outcomes{f' of class {slo.slo_class}' if slo.slo_class else ''}; "
                           f"{' and '.join(c.TAP_NEUTRAL_OUTCOMES)} are left out of the SLI, every outcome but "
                           f"{c.OUTCOME_OK} is bad.")
        return [grid.place(_timeseries("Requests by outcome", [target], unit="reqps", stack=True,
                                       description=description), 24, 8)]
    if slo.sli_kind == SLI_KV_HEADROOM:
        m = [q.regex(c.LABEL_CLUSTER, _var(CLUSTER_VAR))]
        usage = q.agg("max", q.selector(c.KV_CACHE_USAGE.name, m), ENGINE_BY)
        steps = ((None, "green"), (slo.threshold, "red")) if slo.threshold else ((None, "green"),)
        return [grid.place(_timeseries("KV-cache usage per engine vs the headroom threshold",
                                       [gf.prom_target(usage, ENGINE_LEGEND)], unit="percentunit",
                                       steps=steps, threshold_style="line"), 24, 8)]
    return []


# The share of the calendar month (UTC) gone at evaluation time, 0..1.
MONTH_ELAPSED = "scalar((day_of_month() - 1 + (hour() + minute() / 60) / 24) / days_in_month())"


def _month_budget_expr(slo: SLOView, m: list[q.Matcher]) -> str:
    """Error budget left this calendar month; the panel's time range is `now/M` (month so far).

    The month's budget is the objective's share of the month's requests; the month is not over, so its
    requests are the ones so far extrapolated: left = 1 - error ratio so far / budget x share of the month
    gone. Without that last factor a 10-minute outage a day into a month would read as -594%."""
    if slo.traffic_weighted:
        errors = q.over_time("sum", q.selector(c.SLO.sli_errors_rate(slo.base_window), m), "$__range")
        total = q.over_time("sum", q.selector(c.SLO.sli_total_rate(slo.base_window), m), "$__range")
        ratio = f"({errors} / {total})"
    else:
        ratio = q.over_time("avg", q.selector(c.SLO.sli_error_ratio(slo.base_window), m), "$__range")
    return f"1 - {ratio} / {slo.error_budget:g} * {MONTH_ELAPSED}"


def _objective_expr(slo: SLOView) -> str:
    """The objective, once: a central ruler records it without `cluster`, per-cluster rulers once per cluster."""
    return q.agg("max", q.selector(c.SLO.OBJECTIVE, [q.eq(c.SLO.LABEL_ID, slo.slo_id)]), (c.SLO.LABEL_ID,))


def _alert_tier_targets(slo: SLOView) -> list[g.Target]:
    tiers = sorted({(t.name, t.severity) for t in slo.tiers})
    targets = []
    for i, (tier, severity) in enumerate(tiers):
        matchers = [
            q.eq(c.LABEL_ALERTSTATE, c.ALERTSTATE_FIRING), q.eq(c.SLO.LABEL_ID, slo.slo_id), q.eq(c.SLO.LABEL_TIER, tier),
            q.regex(c.LABEL_CLUSTER, _var(CLUSTER_VAR)),
        ]
        expr = q.or_zero(f"count({q.selector(c.PROM_ALERTS, matchers)})")
        targets.append(gf.prom_target(expr, f"{tier} ({severity})", chr(ord("A") + i)))
    return targets


def slo_dashboard(slo: SLOView) -> g.Dashboard:
    """SLI vs objective, budget left (rolling and calendar month), burn rate per window, alerts by tier."""
    m = _slo_matchers(slo)
    grid = _Grid()
    objective = slo.objective / 100.0
    budget_steps = ((None, "red"), (0.0, "orange"), (0.25, "green"))
    panels: list = [grid.row("Objective and error budget")]
    panels += [
        grid.place(_stat(f"SLI over {slo.period}",
                         [gf.prom_target(f"1 - {q.selector(c.SLO.sli_error_ratio(slo.period), m)}", "{{cluster}}")],
                         unit="percentunit", decimals=3, steps=((None, "red"), (objective, "green")),
                         description=f"Good events over all events in the rolling {slo.period}."), 4, 5),
        grid.place(_stat("Objective", [gf.prom_target(_objective_expr(slo), "objective")],
                         unit="percentunit", decimals=3), 4, 5),
        grid.place(_stat(f"Error budget left (rolling {slo.period})",
                         [gf.prom_target(q.selector(c.SLO.PERIOD_ERROR_BUDGET_REMAINING, m), "{{cluster}}")],
                         unit="percentunit", decimals=1, steps=budget_steps), 4, 5),
        grid.place(_stat("Error budget left (this month)",
                         [gf.prom_target(_month_budget_expr(slo, m), "{{cluster}}", instant=True)],
                         unit="percentunit", decimals=1, steps=budget_steps, time_from="now/M",
                         description="Budget left in the calendar month (UTC): the error ratio so far over the "
                                     "budget, times the share of the month gone (the month's budget counts the "
                                     "requests so far, extrapolated to the whole month)"
                                     + (", traffic-weighted." if slo.traffic_weighted else ".")), 4, 5),
        grid.place(_stat(f"Burn rate ({slo.base_window})",
                         [gf.prom_target(q.selector(c.SLO.CURRENT_BURN_RATE, m), "{{cluster}}")],
                         decimals=2, steps=((None, "green"), (1.0, "orange"),
                                            (max((t.factor for t in slo.tiers), default=14.4), "red")),
                         description="1 = spending the budget exactly over the period."), 4, 5),
    ]
    if slo.alert_name and slo.tiers:
        panels.append(grid.place(gf.BarGauge(
            title="Firing alerts by tier", dataSource=gf.PROMETHEUS, targets=_alert_tier_targets(slo),
            minValue=0, thresholds=gf.thresholds((None, "green"), (1, "red")),
            description=f"{slo.alert_name}: one bar per tier (ALERTS, state firing)."), 4, 5))
    panels.append(grid.row("SLI and burn rate"))
    sli_windows = [slo.base_window] + [w for w in ("1h",) if w in slo.windows and w != slo.base_window]
    panels.append(grid.place(_timeseries("SLI vs objective", [
        *(gf.prom_target(f"1 - {q.selector(c.SLO.sli_error_ratio(w), m)}", f"SLI {w} {{{{cluster}}}}", chr(65 + i))
          for i, w in enumerate(sli_windows)),
        gf.prom_target(_objective_expr(slo), "objective", "Z"),
    ], unit="percentunit"), 12, 8))
    burn_windows = sorted({w for t in slo.tiers for w in (t.long_window, t.short_window)} or {slo.base_window},
                          key=window_seconds)
    panels.append(grid.place(_timeseries(
        "Burn rate per window",
        [gf.prom_target(f"{q.selector(c.SLO.sli_error_ratio(w), m)} / {slo.error_budget:g}", w, chr(65 + i))
         for i, w in enumerate(burn_windows)],
        steps=((None, "green"), *sorted({(t.factor, "red") for t in slo.tiers})), threshold_style="line",
        description="Error ratio over each alert window divided by the error budget; lines mark the tiers' factors.",
    ), 12, 8))
    panels.append(grid.place(_timeseries(
        f"Error budget burn-down (rolling {slo.period})",
        [gf.prom_target(q.selector(c.SLO.PERIOD_ERROR_BUDGET_REMAINING, m), "budget left {{cluster}}")],
        unit="percentunit", steps=budget_steps, threshold_style="area", fill=20,
    ), 24, 8))
    if _has_source_panels(slo):
        panels.append(grid.row("What the SLI is made of"))
        panels += _source_panels(slo, grid)
    title = f"SLO / {slo.service} / {slo.name}"
    # Clusters from the SLI's own ratio: it keeps `cluster` wherever one exists (per-cluster rulers behind a fleet
    # store, or a central ruler's `by (cluster)`); the objective has none under a central ruler. One Prometheus
    # without a cluster label lists none, and All shows everything.
    cluster_source = q.selector(c.SLO.sli_error_ratio(slo.base_window), [q.eq(c.SLO.LABEL_ID, slo.slo_id)])
    variables = [gf.query_variable(CLUSTER_VAR, "Cluster", f"label_values({cluster_source}, {c.LABEL_CLUSTER})")]
    description = (slo.description or f"{slo.name} of {slo.service}") + f" Objective {slo.objective:g}% over {slo.period}."
    return _dashboard(title, slo_dashboard_uid(slo.slo_id), description, panels, variables, f"now-{min(slo.period_days, 30)}d",
                      ["slo", slo.service])


# --------------------------------------------------------------------------------------
# Fleet serving dashboard
# --------------------------------------------------------------------------------------
def _fleet_matchers() -> list[q.Matcher]:
    return [q.regex(label, _var(name)) for name, label in FLEET_VARIABLES]


def _gpu_matchers() -> list[q.Matcher]:
    # GPU series carry dcgm-exporter's `hostname`, not `node`; the node variable filters both.
    return [q.regex(c.LABEL_CLUSTER, _var(CLUSTER_VAR)), q.regex(c.LABEL_HOSTNAME, _var("node"))]


def _per_engine(expr_op: str, metric: c.MetricDef, m: list[q.Matcher]) -> str:
    return q.agg(expr_op, q.selector(metric.name, m), ENGINE_BY)


def _summed_lines(m: list[q.Matcher], by: Sequence[str], legend: str, lines: Sequence[tuple[str, str]]) -> list:
    """One target per (word, series name), each summed `by`, its legend the word then `legend`; refs A, B, ..."""
    return [gf.prom_target(q.agg("sum", q.selector(name, m), by), f"{word} {legend}", chr(ord("A") + i))
            for i, (word, name) in enumerate(lines)]


def _fleet_variables() -> list[g.Template]:
    out = []
    chain: list[q.Matcher] = []
    for name, label in FLEET_VARIABLES:
        out.append(gf.query_variable(name, name.capitalize(),
                                     f"label_values({q.selector(c.REQUESTS_RUNNING.name, chain)}, {label})"))
        chain = [*chain, q.regex(label, _var(name))]
    return out


def _goodput_steps(slos: Sequence[SLOView]) -> tuple[tuple[float | None, str], ...]:
    """Red under the lowest goodput objective (the SLOs' own numbers, not a guess); green only without one."""
    objectives = sorted({s.objective for s in slos if s.sli_kind == SLI_GOODPUT})
    return ((None, "red"), (objectives[0] / 100, "green")) if objectives else ((None, "green"),)


def _goodput_note(slos: Sequence[SLOView]) -> str:
    targets = [f"{s.slo_class or s.slo_id} {s.objective:g}%" for s in slos if s.sli_kind == SLI_GOODPUT]
    return f" Objectives: {', '.join(targets)}." if targets else ""


def _kv_steps(slos: Sequence[SLOView]) -> tuple[tuple[float | None, str], ...]:
    """Red over the KV-headroom SLOs' threshold (the lowest, if several)."""
    thresholds = sorted({s.threshold for s in slos if s.sli_kind == SLI_KV_HEADROOM and s.threshold})
    return ((None, "green"), (thresholds[0], "red")) if thresholds else ((None, "green"),)


def _throughput_row(grid: _Grid, m: list[q.Matcher], slos: Sequence[SLOView]) -> list:
    """The row "Throughput and goodput" of the fleet dashboard: its header and panels, placed on `grid`."""
    p: list = [grid.row("Throughput and goodput")]
    p.append(grid.place(_timeseries("Goodput vs raw output tokens/s", [
        gf.prom_target(q.sum_rate(c.GOODPUT_TOKENS.name, m, RATE), "goodput tokens/s (tap)", "A"),
        gf.prom_target(q.sum_rate(c.OUTPUT_TOKENS.name, m, RATE), "output tokens/s (tap)", "B"),
        gf.prom_target(q.sum_rate(c.GENERATION_TOKENS.name, m, RATE), "generated tokens/s (engines)", "C"),
    ], unit="short", description="Goodput counts only tokens of requests that met both their TTFT and TPOT objective."),
        12, 8))
    goodput_about = (f"Goodput requests over the requests the goodput SLIs count (outcomes "
                     f"{' and '.join(c.TAP_NEUTRAL_OUTCOMES)} left out); a class in outage shows 0."
                     + _goodput_note(slos))
    p.append(grid.place(_timeseries("Goodput ratio by SLO class", [gf.prom_target(
        goodput_ratio(m, (c.LABEL_SLO_CLASS,)), "{{slo_class}}")], unit="percentunit", steps=_goodput_steps(slos),
        threshold_style="line", description=goodput_about), 6, 8))
    p.append(grid.place(_stat("Goodput ratio now", [gf.prom_target(goodput_ratio(m), "goodput")],
                              unit="percentunit", decimals=1, steps=_goodput_steps(slos),
                              description=goodput_about), 6, 8))
    p.append(grid.place(_timeseries("Prompt and generation tokens/s by model", [
        gf.prom_target(q.sum_rate(c.PROMPT_TOKENS.name, m, RATE, (c.LABEL_MODEL,)), "prompt {{model}}", "A"),
        gf.prom_target(q.sum_rate(c.GENERATION_TOKENS.name, m, RATE, (c.LABEL_MODEL,)), "generation {{model}}", "B"),
    ]), 24, 7))
    return p


def _tap_latency_row(grid: _Grid, m: list[q.Matcher], slos: Sequence[SLOView]) -> list:
    """The row "Latency as clients see it (the tap)" of the fleet dashboard: its header and panels, placed on `grid`."""
    # Fleet latency comes from the tap, whose buckets are one ladder fleet-wide; the engines' own histograms are
    # read per engine kind (each kind has its ladder). Summed over unlike ladders a p90 of 1.3 s read as 9 s.
    p: list = [grid.row("Latency as clients see it (the tap)")]
    tap_note = "Client-side, from the goodput tap (one bucket ladder on every tap); completed requests only."
    for metric, label in ((c.TAP_TTFT, "TTFT"), (c.TAP_TPOT, "TPOT")):
        p.append(grid.place(gf.Heatmap(title=f"{label} heatmap", dataSource=gf.PROMETHEUS, unit="s", description=tap_note,
                                       targets=[gf.prom_target(q.bucket_rates(metric, m, RATE), "{{le}}", heatmap=True)]),
                            12, 8))
    for metric, label in ((c.TAP_TTFT, "TTFT"), (c.TAP_TPOT, "TPOT")):
        p.append(grid.place(_timeseries(f"{label} p50 / p90 / p99", [
            gf.prom_target(q.histogram_quantile(quant, metric, m, RATE), f"p{round(quant * 100)}", ref)
            for quant, ref in QUANTILES
        ], unit="s", description=tap_note), 12, 8))
    p.append(grid.place(_timeseries(LATE_TITLE + " by SLO class", [_late_requests(m, (c.LABEL_SLO_CLASS,))],
                                    unit="reqps", description=LATE_NOTE), 24, 6))
    return p


def _engine_latency_row(grid: _Grid, m: list[q.Matcher], slos: Sequence[SLOView]) -> list:
    """The row "Latency inside the engines (per engine kind)" of the fleet dashboard: its header and panels, placed on `grid`."""
    p: list = [grid.row("Latency inside the engines (per engine kind)")]
    for metric, label in ((c.TTFT, "TTFT"), (c.TPOT, "TPOT")):
        p.append(grid.place(_timeseries(f"Engine {label} p50 / p90 / p99 per engine kind", [
            gf.prom_target(q.histogram_quantile(quant, metric, m, RATE, PER_KIND), f"p{round(quant * 100)} {{{{engine}}}}",
                           ref)
            for quant, ref in QUANTILES
        ], unit="s", description="Engine-side, one line per engine kind: each kind has its own bucket edges "
                                 "(llmslo/bucket_edges.py), and a sum over unlike ladders misplaces every quantile."),
            12, 8))
    return p


def _queue_kv_row(grid: _Grid, m: list[q.Matcher], slos: Sequence[SLOView]) -> list:
    """The row "Queue and KV cache" of the fleet dashboard: its header and panels, placed on `grid`."""
    engine_legend = ENGINE_LEGEND
    p: list = [grid.row("Queue and KV cache")]
    p.append(grid.place(_timeseries("Queue depth per engine", _summed_lines(m, ENGINE_BY, engine_legend, (
        ("waiting", c.REQUESTS_WAITING.name), ("running", c.REQUESTS_RUNNING.name),
    )), description="Waiting requests are queued for admission; a growing queue is the first sign of saturation."),
        12, 8))
    kv_about = "The line: the KV-headroom SLO's threshold." if len(_kv_steps(slos)) > 1 else ""
    p.append(grid.place(_timeseries("KV-cache usage per engine",
                                    [gf.prom_target(_per_engine("max", c.KV_CACHE_USAGE, m), engine_legend)],
                                    unit="percentunit", steps=_kv_steps(slos), threshold_style="line",
                                    description=kv_about), 6, 8))
    p.append(grid.place(gf.BarGauge(title="KV-cache usage now", dataSource=gf.PROMETHEUS, unit="percentunit",
                                    minValue=0, maxValue=1, thresholds=gf.thresholds(*_kv_steps(slos)),
                                    description=kv_about,
                                    targets=[gf.prom_target(_per_engine("max", c.KV_CACHE_USAGE, m), engine_legend)]),
                        6, 8))
    free_tokens = q.agg("sum", f"{q.selector(c.KV_BLOCKS_FREE.name, m)} * {q.selector(c.KV_BLOCK_SIZE.name, m)}",
                        ENGINE_BY)
    p.append(grid.place(_timeseries("Free KV-cache tokens per engine", [gf.prom_target(free_tokens, engine_legend)],
                                    description="Free blocks times tokens per block: engines' blocks hold 16 to 64 "
                                                "tokens, so blocks alone do not compare. Engines that publish no block "
                                                "size are not shown. Seats (requests that fit): the Capacity row."),
                        8, 8))
    p.append(grid.place(_timeseries("Preemption rate per engine", [gf.prom_target(
        q.sum_rate(c.PREEMPTIONS.name, m, RATE, ENGINE_BY), engine_legend)],
        unit="reqps", description="Requests evicted for lack of KV blocks; any sustained rate hurts TPOT."), 8, 8))
    p.append(grid.place(_timeseries("Prefix-cache hit rate per engine", [gf.prom_target(q.ratio(
        q.sum_rate(c.PREFIX_CACHE_HITS.name, m, RATE, ENGINE_BY),
        q.sum_rate(c.PREFIX_CACHE_QUERIES.name, m, RATE, ENGINE_BY)), engine_legend)],
        unit="percentunit"), 8, 8))
    by_reason = (*ENGINE_BY, c.LABEL_REASON)
    p.append(grid.place(_timeseries(REFUSALS_TITLE, [
        gf.prom_target(q.sum_rate(c.REQUESTS_REJECTED.name, m, RATE, by_reason), "engine {{reason}} " + engine_legend),
        gf.prom_target(q.sum_rate(c.TAP_REFUSALS.name, m, RATE, by_reason), "tap {{reason}} " + engine_legend, "B")],
        unit="reqps", description="The engine's own refusals (vLLM's --max-num-queued-reqs / -tokens caps, TGI's "
                                  "overloaded, Triton's REJECTED, HTTP codes; a client's invalid request too) beside "
                                  "the tap's (its connection and body limits, its KV admission, clients' malformed "
                                  "requests). A sustained rate at a cap is LLMEngineRefusingRequests / "
                                  "LLMTapRefusingRequests."), 12, 8))
    p.append(grid.place(_timeseries(WAITING_BY_REASON_TITLE, [gf.prom_target(
        q.agg("sum", q.selector(c.REQUESTS_WAITING_BY_REASON.name, m), by_reason), "{{reason}} " + engine_legend)],
        description="capacity: no room in the batch yet; deferred: held back by a LoRA slot, a KV transfer or a "
                    "grammar (vLLM, SGLang, llama.cpp). Engines that do not say why are not shown."), 12, 8))
    return p


def _capacity_row(grid: _Grid, m: list[q.Matcher], slos: Sequence[SLOView]) -> list:
    """The row "Capacity: KV seats" of the fleet dashboard: its header and panels, placed on `grid`."""
    p: list = [grid.row("Capacity: KV seats")]
    pool_by = POOL_BY
    pool_legend = POOL_LEGEND
    seats_note = ("Pool series have no node label: they show while Node is All. "
                  "Engines without request-size histograms (TGI, trtllm-serve) have no seats (docs/metrics.md, KV seats).")
    p.append(grid.place(_timeseries("KV seats per pool (p99 and p50 request size)", _summed_lines(
        m, pool_by, pool_legend, (("p99", K.POOL_SEATS_P99), ("p50", K.POOL_SEATS_P50)),
    ), description="How many more requests of p99 (p50) size fit in the pool's free KV cache, net of what its "
                   "running and waiting requests will still take: an estimate, low under heavy prefix sharing. "
                   + seats_note), 8, 8))
    p.append(grid.place(_timeseries("Minutes to KV exhaustion per pool (forecast)", [
        gf.prom_target(q.agg("min", q.selector(K.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION, m), pool_by), pool_legend)],
        unit="m", steps=((None, "red"), (15, "orange"), (60, "green")), threshold_style="line",
        description="What the LLMKVSeatsExhaustion page forecasts: minutes until the pool's free KV tokens, net of "
                    "what its requests will still take, reach 0 at the trend of the last minutes. No data: they are "
                    "not falling, or falling no lower than the last load wave's bottom (a wave, not a trend); 0: "
                    "out, and still falling. " + seats_note), 8, 8))
    # Seats are recorded per conventions.CAPACITY.ENGINE_LABELS (an engine's identity).
    p.append(grid.place(_timeseries("KV seats per engine (p99)", [
        gf.prom_target(q.agg("sum", q.selector(K.SEATS_P99, m), K.ENGINE_LABELS),
                       "{{namespace}}/{{pod}} {{model}} ({{engine}}) {{cluster}}")],
        description=seats_note), 8, 8))
    p.append(grid.place(_timeseries("Queue per pool", [
        gf.prom_target(q.agg("sum", q.selector(c.REQUESTS_WAITING.name, m), pool_by), "waiting " + pool_legend)],
        description="Requests waiting for admission; the page needs it growing while seats run out."), 12, 8))
    p.append(grid.place(_timeseries("Preemption rate per pool", [gf.prom_target(
        q.sum_rate(c.PREEMPTIONS.name, m, RATE, pool_by), pool_legend)], unit="reqps",
        description="Running requests evicted for lack of KV blocks: seats already ran out."), 12, 8))
    return p


def _gpu_row(grid: _Grid, m: list[q.Matcher], slos: Sequence[SLOView]) -> list:
    """The row "GPU memory" of the fleet dashboard: its header and panels, placed on `grid`."""
    gm = _gpu_matchers()
    p: list = [grid.row("GPU memory")]
    gpu_legend = "{{%s}} GPU {{gpu}} {{cluster}}" % c.LABEL_HOSTNAME
    p.append(grid.place(_timeseries("HBM used per GPU", [gf.prom_target(q.selector(c.GPU_MEMORY_USED.name, gm), gpu_legend)],
                                    unit="bytes"), 8, 8))
    p.append(grid.place(_timeseries("HBM free per GPU", [gf.prom_target(q.selector(c.GPU_MEMORY_FREE.name, gm), gpu_legend)],
                                    unit="bytes"), 8, 8))
    p.append(grid.place(gf.BarGauge(title="HBM used / total", dataSource=gf.PROMETHEUS, unit="percentunit",
                                    minValue=0, maxValue=1,
                                    thresholds=gf.thresholds((None, "green"), (0.9, "orange"), (0.97, "red")),
                                    targets=[gf.prom_target(f"{q.selector(c.GPU_MEMORY_USED.name, gm)} / "
                                                            f"{q.selector(c.GPU_MEMORY_TOTAL.name, gm)}", gpu_legend)]),
                        8, 8))
    p.append(grid.place(gf.BarGauge(
        title=GPUS_BY_POOL_TITLE, dataSource=gf.PROMETHEUS, minValue=0, thresholds=gf.thresholds((None, "blue")),
        description="GPUs and MIG instances each pod holds, by the node pool its node's exporter says (--node-pool). "
                    "A pod outside the serving namespaces on the inference pool is LLMInferencePoolForeignPod; "
                    "a node whose exporter is told no pool is not listed.",
        targets=[gf.prom_target(isolation.holders_by_pool(gm), "{{%s}} {{%s}} {{%s}}/{{%s}} {{%s}}" % (
            c.LABEL_NODE_POOL, c.LABEL_HOSTNAME, c.LABEL_NAMESPACE, c.LABEL_POD, c.LABEL_CLUSTER))]), 24, 8))
    return p


def _lora_row(grid: _Grid, m: list[q.Matcher], slos: Sequence[SLOView]) -> list:
    """The row "LoRA adapters" of the fleet dashboard: its header and panels, placed on `grid`."""
    engine_legend = ENGINE_LEGEND
    p: list = [grid.row("LoRA adapters")]
    p.append(grid.place(_timeseries("LoRA adapters running and waiting per engine", _summed_lines(
        m, ENGINE_BY, engine_legend, (("running", c.LORA_ADAPTERS_RUNNING.name), ("waiting", c.LORA_ADAPTERS_WAITING.name)),
    )), 16, 8))
    p.append(grid.place(gf.BarGauge(title="LoRA adapter slots per engine", dataSource=gf.PROMETHEUS, minValue=0,
                                    thresholds=gf.thresholds((None, "blue")),
                                    targets=[gf.prom_target(_per_engine("max", c.LORA_ADAPTERS_MAX, m), engine_legend)]),
                        8, 8))
    return p


def fleet_dashboard(slos: Sequence[SLOView] = ()) -> g.Dashboard:
    """Serving capacity and latency across engines, GPUs and LoRA adapters; thresholds from the SLOs."""
    m = _fleet_matchers()
    grid = _Grid()
    rows = (_throughput_row, _tap_latency_row, _engine_latency_row, _queue_kv_row, _capacity_row, _gpu_row, _lora_row)
    p = [panel for row in rows for panel in row(grid, m, slos)]
    return _dashboard("LLM serving fleet", FLEET_DASHBOARD_UID,
                      "Goodput, latency, queue, KV cache, GPU memory and LoRA adapters across the serving fleet.",
                      p, _fleet_variables(), "now-6h", ["fleet"])


def overview_dashboard(slos: Sequence[SLOView]) -> g.Dashboard:
    """Every SLO of the build in one table (Pyrra's list view), each row opening the SLO's dashboard
    (slogen/artifacts/overview.py)."""
    grid = _Grid()
    panel = grid.place(ov.overview_table(slos), 24, max(8, 3 + len(slos)))
    return _dashboard("SLO overview", OVERVIEW_DASHBOARD_UID,
                      "Every SLO of the build: objective, SLI, error budget left, burn rate and alerts per tier.",
                      [panel], [ov.cluster_variable(slos)], "now-1h", ["slo", "overview"])


# --------------------------------------------------------------------------------------
# Generator entry point
# --------------------------------------------------------------------------------------
def dashboard_files(slos: Sequence[SLOView]) -> dict[str, str]:
    """Relative path -> JSON text for the fleet dashboard, the SLO overview and one dashboard per SLO."""
    return dict(iter_dashboard_files(slos))


def iter_dashboard_files(slos: Sequence[SLOView]) -> Iterator[tuple[str, str]]:
    """The same, one (path, JSON text) at a time in path order, rendered as they are taken."""
    for path, data in iter_dashboard_models(slos):
        yield path, gf.text(data)


def iter_dashboard_models(slos: Sequence[SLOView]) -> Iterator[tuple[str, dict]]:
    """Each dashboard's JSON model (`gf.text` writes its file), in path order: the build's dashboard tests read
    the model rather than parse the text back."""
    yield FLEET_DASHBOARD_FILE, gf.dashboard_json(fleet_dashboard(slos))
    if slos:
        yield OVERVIEW_DASHBOARD_FILE, gf.dashboard_json(overview_dashboard(slos))
    for slo in sorted(slos, key=lambda s: slo_dashboard_path(s.slo_id)):
        yield slo_dashboard_path(slo.slo_id), gf.dashboard_json(slo_dashboard(slo))
