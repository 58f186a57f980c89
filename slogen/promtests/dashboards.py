"""promtool tests for the dashboards: every panel query, run on the synthetic fleet, must give the answer its
title claims, derived here from the fleet's facts (fleet_scenario.py), not from the query.

How a panel is tested: its expression as Grafana sends it with every variable on All (`.*`) and a fixed rate
interval (5m), evaluated by promtool at 10m on the fleet's series (the SLO dashboards' recorded series are
inputs too: the rule files have their own tests), the calendar-month budget at 1d into a 31-day month.
Every panel must have an answer here, every answer must be non-empty, and every `{{label}}` of a legend must
be a label of the answer, or the build stops with the panel's name: a new panel cannot ship untested, and a
legend cannot name a label the series lack (`{{Hostname}}`).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence

from llmslo import conventions as c
from llmslo.conventions import CAPACITY as K
from llmslo.gateways import GATEWAY_SOURCES
from llmslo.gofloat import client_float
from slogen import panels as d
from slogen.errors import SpecError, SpecErrors
from slogen.gofmt import label_filter
from slogen.paths import DASHBOARD_TESTS_FILE, FLEET_DASHBOARD_FILE, OVERVIEW_DASHBOARD_FILE, slo_dashboard_path
from slogen.promtests import fleet_scenario as fs
from slogen.promtests.gateway_fleet import gateway_answers, gateway_series
from slogen.rules.alerts import LOW_TRAFFIC_SUFFIX
from slogen.views import SLI_AVAILABILITY, SLI_GOODPUT, SLI_KV_HEADROOM, SLI_LATENCY, SLOView

TEST_FILE = DASHBOARD_TESTS_FILE
MONTH_MIN = 1440  # the month test evaluates 1d into January 1970 (promtool's clock starts at 0)
MONTH_DAYS = 31
OUTAGE = (600, 610)  # minutes of a full outage in the month test: 10 bad minutes of 1440

Sample = tuple[dict[str, str], float]
Answers = dict[tuple[str, str], list[Sample]]  # (panel title, refId) -> expected samples


def _keep(labels: dict[str, str], by: Sequence[str]) -> dict[str, str]:
    return {k: labels[k] for k in by if k in labels}


def _sum_by(items: list[tuple[dict[str, str], float]], by: Sequence[str]) -> list[Sample]:
    groups: dict[tuple, float] = defaultdict(float)
    for labels, value in items:
        groups[tuple(sorted(_keep(labels, by).items()))] += value
    return [(dict(k), v) for k, v in groups.items()]


def _le(edge: float) -> str:
    return "+Inf" if edge == float("inf") else client_float(edge)


# --------------------------------------------------------------------------------------
# The fleet dashboard
# --------------------------------------------------------------------------------------
def _quantiles(title: str, buckets: list[tuple[dict[str, str], list]]) -> Answers:
    return {(title, ref): [(labels, fs.bucket_quantile(q, b)) for labels, b in buckets] for q, ref in d.QUANTILES}


def _tap_buckets(metric: str, taps) -> list[tuple[float, int]]:
    return fs.cumulative(fs.merge([getattr(t, metric) for t in taps]), fs.tap_edges(metric))


def _per_kind(metric: str, f: fs.Fleet) -> list[tuple[dict[str, str], list]]:
    kinds = sorted({e.kind for e in f.engines if getattr(e, metric)})
    out = []
    for kind in kinds:
        engines = [e for e in f.engines if e.kind == kind and getattr(e, metric)]
        out.append(({c.LABEL_ENGINE: kind}, fs.cumulative(fs.merge([getattr(e, metric) for e in engines]),
                                                           engines[0].edges(metric))))
    return out


def _counted(t: fs.TapClass) -> int:
    """Requests the goodput SLI counts: every outcome but the neutral ones."""
    return sum(n for o, n in t.outcomes if o not in c.TAP_NEUTRAL_OUTCOMES)


def fleet_answers(slos: Sequence[SLOView], f: fs.Fleet = fs.FLEET) -> Answers:
    eng = [(e.labels(), e) for e in f.engines]
    by_engine = lambda value: _sum_by([(lb, float(value(e))) for lb, e in eng if value(e) is not None], d.ENGINE_BY)  # noqa: E731
    classes = sorted({t.slo_class for t in f.taps})
    goodput = {k: sum(t.goodput for t in f.taps if t.slo_class == k) for k in classes}
    counted = {k: sum(_counted(t) for t in f.taps if t.slo_class == k) for k in classes}
    gpu = [(g.labels(), g) for g in f.gpus]
    out: Answers = {
        ("Goodput vs raw output tokens/s", "A"): [({}, float(sum(t.goodput_tps for t in f.taps if t.goodput)))],
        ("Goodput vs raw output tokens/s", "B"): [({}, float(sum(t.output_tps for t in f.taps)))],
        ("Goodput vs raw output tokens/s", "C"): [({}, float(sum(e.generation_tps for e in f.engines)))],
        ("Goodput ratio by SLO class", "A"): [({c.LABEL_SLO_CLASS: k}, goodput[k] / counted[k]) for k in classes],
        ("Goodput ratio now", "A"): [({}, sum(goodput.values()) / sum(counted.values()))],
        (d.LATE_TITLE + " by SLO class", "A"): _sum_by([({c.LABEL_SLO_CLASS: t.slo_class},
                                                         n if o in c.TAP_LATE_OUTCOMES else 0)
                                                        for t in f.taps for o, n in t.outcomes], (c.LABEL_SLO_CLASS,)),
        ("Prompt and generation tokens/s by model", "A"): _sum_by([(lb, e.prompt_tps) for lb, e in eng], (c.LABEL_MODEL,)),
        ("Prompt and generation tokens/s by model", "B"): _sum_by([(lb, e.generation_tps) for lb, e in eng], (c.LABEL_MODEL,)),
        ("Queue depth per engine", "A"): by_engine(lambda e: e.waiting),
        ("Queue depth per engine", "B"): by_engine(lambda e: e.running),
        ("KV-cache usage per engine", "A"): by_engine(lambda e: e.usage),
        ("KV-cache usage now", "A"): by_engine(lambda e: e.usage),
        ("Free KV-cache tokens per engine", "A"): by_engine(lambda e: e.free_blocks * e.block_size if e.block_size else None),
        ("Preemption rate per engine", "A"): by_engine(lambda e: e.preemptions),
        ("Prefix-cache hit rate per engine", "A"): by_engine(lambda e: e.prefix[0] / e.prefix[1] if e.prefix else None),
        (d.REFUSALS_TITLE, "A"): _sum_by([({**lb, c.LABEL_REASON: r}, n) for lb, e in eng for r, n in e.rejected],
                                         (*d.ENGINE_BY, c.LABEL_REASON)),
        (d.REFUSALS_TITLE, "B"): _sum_by([(fs.tap_refusal_labels(*key), n) for key, n in f.tap_refusals.items()],
                                         (*d.ENGINE_BY, c.LABEL_REASON)),
        (d.WAITING_BY_REASON_TITLE, "A"): _sum_by([({**lb, c.LABEL_REASON: r}, n) for lb, e in eng for r, n in e.waiting_by],
                                                  (*d.ENGINE_BY, c.LABEL_REASON)),
        ("KV seats per pool (p99 and p50 request size)", "A"): _pools(f, 0),
        ("KV seats per pool (p99 and p50 request size)", "B"): _pools(f, 1),
        ("Minutes to KV exhaustion per pool (forecast)", "A"): _pools(f, 2),
        # Recorded per conventions.CAPACITY.ENGINE_LABELS.
        ("KV seats per engine (p99)", "A"): _sum_by([(_keep(lb, K.ENGINE_LABELS), f.seats_p99[fs.engine_key(e)])
                                                     for lb, e in eng if fs.engine_key(e) in f.seats_p99],
                                                    K.ENGINE_LABELS),
        ("Queue per pool", "A"): _sum_by([(lb, e.waiting) for lb, e in eng], d.POOL_BY),
        ("Preemption rate per pool", "A"): _sum_by([(lb, e.preemptions) for lb, e in eng], d.POOL_BY),
        ("HBM used per GPU", "A"): [({"__name__": c.GPU_MEMORY_USED.name, **lb}, float(g.used)) for lb, g in gpu],
        ("HBM free per GPU", "A"): [({"__name__": c.GPU_MEMORY_FREE.name, **lb}, float(g.total - g.used)) for lb, g in gpu],
        ("HBM used / total", "A"): [(lb, g.used / g.total) for lb, g in gpu],
        (d.GPUS_BY_POOL_TITLE, "A"): _sum_by([({**lb, c.LABEL_NODE_POOL: f.node_pools[g.hostname]}, 1.0)
                                              for lb, g in gpu if g.pod and g.hostname in f.node_pools], d.GPUS_BY_POOL_BY),
        ("LoRA adapters running and waiting per engine", "A"): by_engine(lambda e: e.lora[0] if e.lora else None),
        ("LoRA adapters running and waiting per engine", "B"): by_engine(lambda e: e.lora[1] if e.lora else None),
        ("LoRA adapter slots per engine", "A"): by_engine(lambda e: e.lora[2] if e.lora else None),
    }
    for metric, name in (("ttft", "TTFT"), ("tpot", "TPOT")):
        buckets = _tap_buckets(metric, f.taps)
        out[(f"{name} heatmap", "A")] = [({c.LABEL_LE: _le(e)}, float(n)) for e, n in buckets]
        out.update(_quantiles(f"{name} p50 / p90 / p99", [({}, buckets)]))
        out.update(_quantiles(f"Engine {name} p50 / p90 / p99 per engine kind", _per_kind(metric, f)))
    return out


def _pools(f: fs.Fleet, i: int) -> list[Sample]:
    out = []
    for (ns, model), values in f.pool_seats.items():
        value = values[i]
        if value is not None:
            labels = {c.LABEL_CLUSTER: fs.CLUSTER, c.LABEL_NAMESPACE: ns, c.LABEL_MODEL: model}
            out.append(({k: v for k, v in labels.items() if v}, float(value)))
    return out


# --------------------------------------------------------------------------------------
# The per-SLO dashboards
# --------------------------------------------------------------------------------------
def _windows(slo: SLOView) -> list[str]:
    from slogen.views import window_seconds
    tiers = {w for t in slo.tiers for w in (t.long_window, t.short_window)}
    return sorted({*slo.windows, *tiers, slo.period, slo.base_window}, key=window_seconds)


def error_ratio(slo: SLOView, window: str) -> float:
    """The recorded error ratio the test feeds in over `window`: a different share of the budget per window,
    so that a panel reading the wrong window shows the wrong number."""
    return slo.error_budget * (_windows(slo).index(window) + 1) / 16


def _slo_labels(slo: SLOView, window: str | None = None) -> dict[str, str]:
    out = {c.SLO.LABEL_ID: slo.slo_id, c.SLO.LABEL_SERVICE: slo.service, c.SLO.LABEL_SLO: slo.name,
           c.LABEL_CLUSTER: fs.CLUSTER}
    return {**out, c.SLO.LABEL_WINDOW: window} if window else out


def budget_left(slo: SLOView) -> float:
    return 1 - error_ratio(slo, slo.period) / slo.error_budget


SCOPED_NAMESPACE = "monitoring"  # a namespace-scoped build's static alert label (slogen/rules/scope.py)


def staged_alerts(slo: SLOView) -> list[tuple[str, str]]:
    """(slo_tier, sloth_severity) of the alerts firing for `slo` in the fleet test: its first tier by name, and
    the low-traffic twin (a ticket) of its second page tier, so the overview shows page, ticket and none."""
    if not (slo.alert_name and slo.tiers):
        return []
    first = sorted(slo.tiers, key=lambda t: t.name)[0]
    pages = sorted({t.name for t in slo.tiers if t.severity == "page"} - {first.name})
    return [(first.name, first.severity)] + [(name + LOW_TRAFFIC_SUFFIX, "ticket") for name in pages[:1]]


def _alert_labels(slo: SLOView, tier: str, severity: str) -> dict[str, str]:
    """An SLO alert's labels as the rules write them: the SLO's identity and cluster (`max without
    (sloth_window)`), the tier's static labels, and the namespace of a scoped build."""
    return {**_slo_labels(slo), c.LABEL_ALERTNAME: slo.alert_name, c.LABEL_ALERTSTATE: c.ALERTSTATE_FIRING,
            c.SLO.LABEL_TIER: tier, c.SLO.LABEL_SEVERITY: severity, c.LABEL_NAMESPACE: SCOPED_NAMESPACE}


def period_burn(slo: SLOView) -> float:
    return error_ratio(slo, slo.period) / slo.error_budget


def slo_series(slo: SLOView) -> list[tuple[str, dict[str, str], str]]:
    """The SLO rules' recorded series at the fleet test's evaluation time, and the alerts `staged_alerts` fires."""
    out = [(c.SLO.sli_error_ratio(w), _slo_labels(slo, w), fs.gauge(error_ratio(slo, w))) for w in _windows(slo)]
    ident = {k: v for k, v in _slo_labels(slo).items() if k != c.LABEL_CLUSTER}
    out += [(c.SLO.OBJECTIVE, ident, fs.gauge(_objective(slo))),  # a central ruler records it without cluster
            (c.SLO.ERROR_BUDGET, ident, fs.gauge(slo.error_budget)),
            (c.SLO.PERIOD_BURN_RATE, _slo_labels(slo), fs.gauge(period_burn(slo))),
            (c.SLO.PERIOD_ERROR_BUDGET_REMAINING, _slo_labels(slo), fs.gauge(budget_left(slo))),
            (c.SLO.CURRENT_BURN_RATE, _slo_labels(slo), fs.gauge(error_ratio(slo, slo.base_window) / slo.error_budget))]
    out += [(c.PROM_ALERTS, _alert_labels(slo, tier, severity), fs.gauge(1)) for tier, severity in staged_alerts(slo)]
    return out


def _objective(slo: SLOView) -> float:
    return round(slo.objective / 100, 12)


def _budget(slo: SLOView) -> float:
    """The budget as the dashboards write it into a query (`%g`)."""
    return float(f"{slo.error_budget:g}")


def month_series(slo: SLOView) -> list[tuple[str, dict[str, str], str]]:
    """A day of the base window's rates: one request a second, all of them bad for 10 minutes (traffic-weighted);
    or a constant error ratio of half the budget (time-weighted SLOs, without event rates)."""
    labels = _slo_labels(slo, slo.base_window)
    start, end = OUTAGE
    if slo.traffic_weighted:
        bad = f"_ 0x{start - 1} 1x{end - start - 1} 0x{MONTH_MIN - end - 1}"
        return [(c.SLO.sli_errors_rate(slo.base_window), labels, bad),
                (c.SLO.sli_total_rate(slo.base_window), labels, f"_ 1x{MONTH_MIN - 1}")]
    return [(c.SLO.sli_error_ratio(slo.base_window), labels, f"_ {fs.gauge(slo.error_budget / 2, MONTH_MIN - 1)}")]


def month_answer(slo: SLOView) -> float:
    """Budget left 1d into a 31-day month: the day's error ratio over the budget, times 1/31 of the month gone."""
    ratio = (OUTAGE[1] - OUTAGE[0]) / MONTH_MIN if slo.traffic_weighted else slo.error_budget / 2
    return 1 - ratio / _budget(slo) * ((2 - 1 + (0 + 0 / 60) / 24) / MONTH_DAYS)


def slo_answers(slo: SLOView, f: fs.Fleet = fs.FLEET) -> Answers:
    labels = _slo_labels(slo)
    raw = lambda name, value: [({"__name__": name, **labels}, value)]  # noqa: E731
    ratio = lambda w: [(_slo_labels(slo, w), 1 - error_ratio(slo, w))]  # noqa: E731
    objective = [({c.SLO.LABEL_ID: slo.slo_id}, _objective(slo))]
    out: Answers = {
        (f"SLI over {slo.period}", "A"): ratio(slo.period),
        ("Objective", "A"): objective,
        (f"Error budget left (rolling {slo.period})", "A"): raw(c.SLO.PERIOD_ERROR_BUDGET_REMAINING, budget_left(slo)),
        (f"Error budget burn-down (rolling {slo.period})", "A"): raw(c.SLO.PERIOD_ERROR_BUDGET_REMAINING,
                                                                     budget_left(slo)),
        (f"Burn rate ({slo.base_window})", "A"): raw(c.SLO.CURRENT_BURN_RATE,
                                                     error_ratio(slo, slo.base_window) / slo.error_budget),
        ("Error budget left (this month)", "A"): [(_slo_labels(slo, slo.base_window), month_answer(slo))],
        ("SLI vs objective", "Z"): objective,
    }
    sli_windows = [slo.base_window] + [w for w in ("1h",) if w in slo.windows and w != slo.base_window]
    for i, w in enumerate(sli_windows):
        out[("SLI vs objective", chr(65 + i))] = ratio(w)
    from slogen.views import window_seconds
    burn = sorted({w for t in slo.tiers for w in (t.long_window, t.short_window)} or {slo.base_window}, key=window_seconds)
    for i, w in enumerate(burn):
        out[("Burn rate per window", chr(65 + i))] = [(_slo_labels(slo, w), error_ratio(slo, w) / _budget(slo))]
    if slo.alert_name and slo.tiers:
        tiers = sorted({t.name for t in slo.tiers})
        for i, _tier in enumerate(tiers):
            out[("Firing alerts by tier", chr(65 + i))] = [({}, 1.0 if i == 0 else 0.0)]
    out.update(_source_answers(slo, f))
    return out


def _source_answers(slo: SLOView, f: fs.Fleet) -> Answers:
    if slo.source in GATEWAY_SOURCES:
        return gateway_answers(slo)
    taps = [t for t in f.taps if not slo.slo_class or t.slo_class == slo.slo_class]
    if slo.sli_kind == SLI_LATENCY and slo.source == "tap":
        metric, name = slo.latency_metric, slo.latency_metric.upper()
        buckets = _tap_buckets(metric, taps)
        title = f"{name} percentiles vs the {slo.threshold:g}s threshold" if slo.threshold else f"{name} percentiles"
        late = [n for t in taps for o, n in t.outcomes if o in c.TAP_LATE_OUTCOMES]
        return {**_quantiles(title, [({}, buckets)]),
                (f"{name} distribution", "A"): [({c.LABEL_LE: _le(e)}, float(n)) for e, n in buckets],
                (d.LATE_TITLE, "A"): [({}, float(sum(late)))] if taps else []}
    if slo.sli_kind == SLI_LATENCY:
        name = slo.latency_metric.upper()
        title = f"{name} percentiles vs the {slo.threshold:g}s threshold" if slo.threshold else f"{name} percentiles"
        return _quantiles(f"{title}, per engine kind", _per_kind(slo.latency_metric, f))
    if slo.sli_kind == SLI_GOODPUT:
        title = "Requests within objective vs requests the SLI counts"
        return {(title, "A"): [({}, float(sum(t.goodput for t in taps)))],  # 0 for a class without goodput series
                (title, "B"): [({}, float(sum(_counted(t) for t in taps)))]}
    if slo.sli_kind == SLI_AVAILABILITY and slo.source == "engine":
        return {("Requests by outcome", "A"): _sum_by(
            [({c.LABEL_REASON: r}, n) for e in f.engines for r, n in e.finished], (c.LABEL_REASON,))}
    if slo.sli_kind == SLI_AVAILABILITY:
        return {("Requests by outcome", "A"): _sum_by(
            [({c.LABEL_OUTCOME: o}, n) for t in taps for o, n in t.outcomes], (c.LABEL_OUTCOME,))}
    if slo.sli_kind == SLI_KV_HEADROOM:
        return {("KV-cache usage per engine vs the headroom threshold", "A"): _sum_by(
            [(e.labels(), e.usage) for e in f.engines], d.ENGINE_BY)}
    return {}


# --------------------------------------------------------------------------------------
# The SLO overview
# --------------------------------------------------------------------------------------
def _firing_state(slo: SLOView, tier: str) -> str:
    """What the overview shows for `tier` of `slo`: page beats ticket beats none (the twin counts as its tier)."""
    severities = {sev for name, sev in staged_alerts(slo) if name in (tier, tier + LOW_TRAFFIC_SUFFIX)}
    return d.FIRING_PAGE if "page" in severities else d.FIRING_TICKET if severities else d.FIRING_NONE


def overview_answers(slos: Sequence[SLOView]) -> Answers:
    """Every column of the overview, a row per SLO in the fleet's one cluster, from the recorded inputs above:
    percentages of the objective, the period's SLI and the budget left, each tier's burn over its long window
    (every SLO records those windows), each tier's firing state as a label."""
    columns = [[(_slo_labels(s), 100 * _objective(s)) for s in slos],
               [(_slo_labels(s), 100 * (1 - period_burn(s) * s.error_budget)) for s in slos],
               [(_slo_labels(s), 100 * budget_left(s)) for s in slos]]
    columns += [[(_slo_labels(s), error_ratio(s, window) / s.error_budget) for s in slos if window in _windows(s)]
                for _tier, window in d.overview_burn_columns(slos)]
    for tier in d.overview_tiers(slos):
        states = [(s, _firing_state(s, tier)) for s in slos]
        columns.append([({**_slo_labels(s), d.firing_label(tier): state}, float(state != d.FIRING_NONE))
                        for s, state in states])
    return {(d.OVERVIEW_TITLE, d.overview_ref(i)): samples for i, samples in enumerate(columns)}


# --------------------------------------------------------------------------------------
# The test file
# --------------------------------------------------------------------------------------
def grafana_expr(expr: str, range_: str = "1h") -> str:
    """What Grafana sends: every variable on All (`.*`), the fixed rate interval, `$__range` as given."""
    expr = expr.replace("$__rate_interval", fs.RATE_INTERVAL).replace("$__range", range_)
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", ".*", expr)


_LEGEND_LABEL = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def _targets(dashboard: dict):
    def panels_of(panels):
        for panel in panels:
            for target in panel.get("targets", []):
                yield panel.get("title", ""), target
            yield from panels_of(panel.get("panels", []))
    yield from panels_of(dashboard.get("panels", []))


def _cumulative(samples: list[Sample]) -> bool:
    """Whether a heatmap's `le` buckets rise with `le`: Grafana draws the differences of neighbours as cells."""
    values = [v for _, v in sorted(samples, key=lambda s: float(s[0].get(c.LABEL_LE, "nan")))]
    return all(a <= b for a, b in zip(values, values[1:], strict=False))


def dashboard_tests(slos: Sequence[SLOView], files: Mapping[str, str]) -> dict:
    """The promtool test document for every panel of every generated dashboard (`files`: path -> JSON text)."""
    tests = DashboardTests(slos)
    for path in sorted(files):
        tests.add(path, files[path])
    return tests.document()


class DashboardTests:
    """The dashboards' promtool tests, gathered one dashboard at a time as the build renders them (a build of
    10,000 SLOs need not hold 300 MB of dashboard JSON to test it): `add` each in path order, then `document`."""

    def __init__(self, slos: Sequence[SLOView]) -> None:
        self.slos = slos
        self.fleet = fs.fleet_for({s.slo_class for s in slos if s.slo_class})
        self.by_path = {FLEET_DASHBOARD_FILE: fleet_answers(slos, self.fleet),
                        **({OVERVIEW_DASHBOARD_FILE: overview_answers(slos)} if slos else {}),
                        **{slo_dashboard_path(s.slo_id): slo_answers(s, self.fleet) for s in slos}}
        self.errors: list[SpecError] = []
        self.main: list[dict] = []
        self.month: list[dict] = []

    def add(self, path: str, dashboard: str | dict) -> None:
        """One rendered dashboard's panels (its JSON text, or the model it was written from): a test case each,
        or an error naming the panel."""
        errors, main, month = self.errors, self.main, self.month
        answers = self.by_path.pop(path, {})
        seen = set()
        for title, target in _targets(json.loads(dashboard) if isinstance(dashboard, str) else dashboard):
            key = (title, target["refId"])
            seen.add(key)
            expected = answers.get(key)
            where = f"panel {title!r} (query {target['refId']})"
            if not expected:
                why = "has no expected answer" if expected is None else "gets no data from the synthetic fleet"
                errors.append(SpecError(path, f"{where} {why}",
                                        fix="add its answer to slogen/promtests/dashboards.py (and series to "
                                            "fleet_scenario.py if the fleet lacks them): every panel proves its number"))
                continue
            if target.get("format") == "heatmap" and not _cumulative(expected):
                errors.append(SpecError(path, f"{where}: a heatmap whose buckets do not rise with `le` (Grafana would "
                                              "draw negative cells)", fix="read one bucket ladder (promql.check_one_ladder)"))
            carried = set().union(*(set(lb) for lb, _ in expected))
            for label in _LEGEND_LABEL.findall(target.get("legendFormat", "")):
                if label not in carried:
                    errors.append(SpecError(path, f"{where}: legend names {{{{{label}}}}}, a label its series do not have",
                                            fix=f"use one of: {', '.join(sorted(carried)) or '(none: a fixed legend)'}"))
            in_month = title == "Error budget left (this month)"
            case = {"expr": grafana_expr(target["expr"], "1d" if in_month else "1h"),
                    "eval_time": f"{MONTH_MIN if in_month else fs.EVAL_MIN}m",
                    "exp_samples": [{"labels": label_filter(lb), "value": float(v)} for lb, v in
                                    sorted(expected, key=lambda s: sorted(s[0].items()))]}
            (month if in_month else main).append(case)
        for key in sorted(set(answers) - seen):
            errors.append(SpecError(path, f"an expected answer for panel {key[0]!r} (query {key[1]}), which the "
                                          "dashboard does not have", fix="remove it from slogen/promtests/dashboards.py"))

    def document(self) -> dict:
        """The whole test document; raises SpecErrors naming every panel without a proven answer."""
        slos, fleet, main, month = self.slos, self.fleet, self.main, self.month
        if self.errors:
            raise SpecErrors(self.errors)
        series = fs.fleet_series(fleet) + gateway_series(slos) + [s for slo in slos for s in slo_series(slo)]
        month_inputs = [s for slo in slos for s in month_series(slo)]

        def group(name: str, inputs, cases) -> dict:
            return {"name": name, "interval": f"{fs.STEP_S // 60}m",
                    "input_series": [{"series": n + label_filter(lb), "values": v} for n, lb, v in inputs],
                    "promql_expr_test": cases}

        return {"rule_files": [], "evaluation_interval": "1m", "tests": [
            group("every panel on the synthetic fleet (slogen/promtests/fleet_scenario.py) at 10m, rate interval 5m",
                  series, main),
            group("calendar-month budget 1d into a 31-day month after a 10-minute outage", month_inputs, month),
        ]}
